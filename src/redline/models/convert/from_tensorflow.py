"""TensorFlow to ONNX: a SavedModel's ``serving_default`` signature, through tf2onnx.

A SavedModel (or a Keras model, see ``from_keras``) is read as one :class:`ServingFunction`:
named tensors in, named tensors out, as TF Serving serves it. tf2onnx converts that function with
the same names, several inputs allowed; an operator tf2onnx cannot map is refused by name before
anything is stored, and the parity check compares every output on the caller's sample.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from redline.errors import ConversionError
from redline.models.convert.frameworks import import_framework
from redline.models.convert.parity import compare_output, ort_session
from redline.models.convert.signature import ConvertedModel

SIGNATURE = "serving_default"  # what TF Serving answers when a request names no signature
ORT_DOMAINS = ("com.microsoft",)  # contrib operators ONNX Runtime runs though ONNX lacks them


@dataclass
class ServingFunction:
    """A model as one function of named tensors: what is converted and what ONNX is held to."""

    call: Callable[..., dict[str, Any]]  # tensors in ``inputs`` order -> {output name: tensor}
    inputs: list[Any]  # tf.TensorSpec each, named as the model's input
    framework: str
    framework_version: str
    source: str  # how messages name the model: "the SavedModel models/fraud"
    owner: Any = None  # keeps the loaded SavedModel alive while its functions are in use


def import_tensorflow() -> Any:
    """TensorFlow, its C++ start-up notices (oneDNN, CPU features) quiet unless asked for."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return import_framework("tensorflow", "tensorflow")


def saved_model_serving(model: Any) -> ServingFunction:
    """The ``serving_default`` signature of a SavedModel folder (or of a loaded SavedModel)."""
    tf = import_tensorflow()
    source = f"the SavedModel {model}" if isinstance(model, str | os.PathLike) else "the SavedModel"
    loaded = model
    if isinstance(model, str | os.PathLike):
        try:
            loaded = tf.saved_model.load(str(Path(model)))
        except Exception as exc:
            raise ConversionError(f"cannot load {source}: {_first_line(exc)}") from exc
    signatures = getattr(loaded, "signatures", None) or {}
    if SIGNATURE not in signatures:
        raise ConversionError(
            f"{source} has no '{SIGNATURE}' signature (it has "
            f"{', '.join(sorted(signatures)) or 'none'}); save it with "
            f"tf.saved_model.save(module, path, signatures={{'{SIGNATURE}': fn}}), the signature "
            "TF Serving answers by default.",
            signatures=sorted(signatures),
        )
    function = signatures[SIGNATURE]
    specs = function.structured_input_signature[1]
    names = sorted(specs)  # a signature's inputs are a map: in name order, as TF Serving lists
    return ServingFunction(
        call=lambda *tensors: function(**dict(zip(names, tensors, strict=True))),
        inputs=[tf.TensorSpec(specs[n].shape, specs[n].dtype, name=n) for n in names],
        framework="tensorflow",
        framework_version=str(tf.__version__),
        source=source,
        owner=loaded,
    )


def convert_serving(
    serving: ServingFunction, sample: Any, tolerance: float, opset: int
) -> ConvertedModel:
    """Convert ``serving`` with tf2onnx, refuse what ONNX cannot run, check it on ``sample``."""
    feeds = sample_feeds(serving, sample)
    onx = to_onnx(serving, opset)
    refuse_unsupported(onx, serving)
    data = onx.SerializeToString()
    session = ort_session(data)
    try:
        got = session.run(None, feeds)
    except Exception as exc:
        raise ConversionError(f"the converted ONNX model fails on the sample: {exc}") from exc
    expected = reference_outputs(serving, feeds)
    max_abs_diff = 0.0
    for out, value in zip(session.get_outputs(), got, strict=True):
        if out.name not in expected:
            raise ConversionError(
                f"the converted model has an output '{out.name}' that {serving.source} does "
                f"not ({', '.join(expected)}); it cannot be converted faithfully."
            )
        max_abs_diff = max(max_abs_diff,
                           compare_output(out.name, expected[out.name], value, tolerance))
    first = feeds[serving.inputs[0].name]
    return ConvertedModel(
        onnx_bytes=data,
        framework=serving.framework,
        framework_version=serving.framework_version,
        task="regression",  # a TensorFlow model does not say; --task / --labels tell redline
        class_labels=None,
        input_name=serving.inputs[0].name,
        output_names=[o.name for o in session.get_outputs()],
        n_features=int(np.prod(first.shape[1:])),
        max_abs_diff=max_abs_diff,
        handles_missing=False,
    )


def sample_feeds(serving: ServingFunction, sample: Any) -> dict[str, np.ndarray]:
    """The sample as one array per input, in each input's dtype, checked against its shape.

    A model with one input takes a plain array; several inputs take a mapping of input name to
    array (an ``.npz`` with one array per input)."""
    names = [spec.name for spec in serving.inputs]
    if isinstance(sample, Mapping):
        arrays = dict(sample)
        if len(names) == 1 and names[0] not in arrays and "X" in arrays:
            arrays = {names[0]: arrays["X"]}
    elif len(names) == 1:
        arrays = {names[0]: sample}
    else:
        arrays = {}
    missing = [n for n in names if n not in arrays]
    if missing:
        given = f"arrays {', '.join(map(str, arrays))}" if arrays else "one array"
        raise ConversionError(
            f"{serving.source} takes the inputs {', '.join(names)} but the sample has {given}: "
            "pass one array per input, named as the input (an .npz file with arrays "
            f"{', '.join(names)}).",
            missing=missing,
        )
    feeds: dict[str, np.ndarray] = {}
    for spec in serving.inputs:
        dtype = spec.dtype
        if not (dtype.is_floating or dtype.is_integer or dtype.is_bool):
            raise ConversionError(
                f"input '{spec.name}' of {serving.source} is {dtype.name}: redline converts "
                "models whose inputs are numbers; move text handling out of the model."
            )
        try:
            value = np.ascontiguousarray(np.asarray(arrays[spec.name], dtype=dtype.as_numpy_dtype))
        except (TypeError, ValueError) as exc:
            raise ConversionError(
                f"the sample for input '{spec.name}' cannot be read as {dtype.name} ({exc})"
            ) from exc
        if value.ndim == 0 or value.shape[0] == 0 or not spec.shape.is_compatible_with(
                value.shape):
            wanted = ("(" + ", ".join("any" if d is None else str(d) for d in spec.shape.as_list())
                      + ")") if spec.shape.rank is not None else "any shape"
            raise ConversionError(
                f"the sample for input '{spec.name}' has shape {value.shape} but "
                f"{serving.source} takes {wanted}: pass representative rows, batch first."
            )
        feeds[spec.name] = value
    rows = {len(v) for v in feeds.values()}
    if len(rows) > 1:
        raise ConversionError(
            "the sample's inputs have different numbers of rows "
            f"({', '.join(f'{k}: {len(v)}' for k, v in feeds.items())}); give each input the "
            "same rows."
        )
    return feeds


def to_onnx(serving: ServingFunction, opset: int) -> Any:
    """tf2onnx's ONNX model of ``serving``: inputs and outputs keep the signature's names."""
    tf = import_tensorflow()
    tf2onnx = import_framework("tf2onnx", "tensorflow")
    function = tf.function(serving.call, input_signature=serving.inputs)
    try:
        with _quiet_tf2onnx():
            onx, _ = tf2onnx.convert.from_function(
                function, input_signature=serving.inputs, opset=opset)
    except Exception as exc:
        raise ConversionError(
            f"converting {serving.source} to ONNX failed: {_first_line(exc)}. Check that its "
            "operators are ones tf2onnx converts, or convert it to ONNX yourself and add the "
            ".onnx file."
        ) from exc
    return onx


def refuse_unsupported(onx: Any, serving: ServingFunction) -> None:
    """Refuse a model with operators tf2onnx left as TensorFlow ones, naming each."""
    import onnx

    found: dict[str, str] = {}  # operator -> the first node that uses it
    for node in _nodes(onx.graph):
        if node.domain in ORT_DOMAINS or onnx.defs.has(node.op_type, node.domain or ""):
            continue
        found.setdefault(node.op_type, _tf_node_name(node.name))
    if not found:
        return
    tf2onnx = import_framework("tf2onnx", "tensorflow")
    listed = ", ".join(f"'{op}' (node '{node}')" for op, node in found.items())
    raise ConversionError(
        f"cannot convert {serving.source}: tf2onnx {tf2onnx.__version__} has no ONNX "
        f"equivalent for the TensorFlow operator{'s' if len(found) > 1 else ''} {listed}. "
        "Build the model from operations ONNX supports, or convert it to ONNX yourself and add "
        "the .onnx file. Nothing was added.",
        operators=sorted(found),
    )


def reference_outputs(serving: ServingFunction, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """What the original model answers on the sample, by output name."""
    tf = import_tensorflow()
    try:
        answer = serving.call(*[tf.constant(feeds[spec.name]) for spec in serving.inputs])
    except Exception as exc:
        raise ConversionError(
            f"{serving.source} fails on the sample: {_first_line(exc)}. The sample must be "
            "inputs the model accepts."
        ) from exc
    return {name: np.asarray(value) for name, value in answer.items()}


def _nodes(graph: Any) -> Iterator[Any]:
    """Every node of ``graph`` and of the subgraphs (If, Loop, Scan bodies) inside it."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _nodes(attr.g)
            for sub in attr.graphs:
                yield from _nodes(sub)


def _tf_node_name(name: str) -> str:
    """The node's name in the user's model, without the call wrappers tracing adds."""
    parts = name.split("/")
    while len(parts) > 1 and parts[0] in ("PartitionedCall", "StatefulPartitionedCall"):
        parts = parts[1:]
    return "/".join(parts)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].rstrip(".")


@contextlib.contextmanager
def _quiet_tf2onnx() -> Iterator[None]:
    """tf2onnx logs every step and each unsupported operator: the refusal says it once, clearly."""
    logger = logging.getLogger("tf2onnx")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
