"""The canonical ONNX signature every converter produces, and the record of one conversion.

One 2-D float32 input named ``input`` (``[batch, n_features]``; for PyTorch whatever rank the
sample has); outputs ``label`` + ``probabilities`` for classifiers (plain tensors, never a
ZipMap), ``variable`` for regressors and ``output`` for PyTorch modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from redline.errors import ConversionError
from redline.models.convert.frameworks import framework_version

DEFAULT_OPSET = 17  # supported by skl2onnx, torch.onnx and onnxruntime
ML_OPSET = 3  # the newest ai.onnx.ml the LightGBM/XGBoost converters (onnxmltools) emit
BOOSTER_MAX_OPSET = 15  # onnxmltools' own entry point refuses anything newer
INPUT_NAME = "input"
CLASSIFIER_OUTPUTS = ["label", "probabilities"]
REGRESSOR_OUTPUTS = ["variable"]
TORCH_OUTPUTS = ["output"]


@dataclass
class ConvertedModel:
    """An ONNX model plus what the repository records about it (task, labels, parity result)."""

    onnx_bytes: bytes
    framework: str
    framework_version: str
    task: str
    class_labels: list[Any] | None
    input_name: str
    output_names: list[str]
    n_features: int
    max_abs_diff: float
    handles_missing: bool


def rename_outputs(onx: Any, names: list[str]) -> None:
    """Rename the graph outputs, in order, to the canonical ``names`` (edges follow the rename)."""
    graph = onx.graph
    if len(graph.output) != len(names):
        raise ConversionError(
            f"the converter produced outputs {[o.name for o in graph.output]}, expected "
            f"{len(names)} ({', '.join(names)}); this model type is not supported."
        )
    if any(node.op_type == "ZipMap" for node in graph.node):
        raise ConversionError("the converter emitted a ZipMap; redline serves plain tensors only")
    mapping = {o.name: new for o, new in zip(graph.output, names, strict=True) if o.name != new}
    if not mapping:
        return
    taken = {n for node in graph.node for n in (*node.input, *node.output)}
    # an internal edge that already uses a canonical name moves aside
    for new in list(mapping.values()):
        if new in taken and new not in mapping:
            mapping[new] = f"{new}_internal"
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name in mapping:
                node.output[i] = mapping[name]
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
    for out in graph.output:
        out.name = mapping.get(out.name, out.name)


def tabular_result(
    onx: Any,
    framework: str,
    is_classifier: bool,
    labels: list[Any] | None,
    x: np.ndarray,
    handles_missing: bool,
) -> ConvertedModel:
    """The record of a converted table model (rows of features in, label/scores out)."""
    return ConvertedModel(
        onnx_bytes=onx.SerializeToString(),
        framework=framework,
        framework_version=framework_version(framework),
        task="classification" if is_classifier else "regression",
        class_labels=labels,
        input_name=INPUT_NAME,
        output_names=list(CLASSIFIER_OUTPUTS if is_classifier else REGRESSOR_OUTPUTS),
        n_features=int(x.shape[1]),
        max_abs_diff=0.0,
        handles_missing=handles_missing,
    )


def plain(value: Any) -> Any:
    """numpy scalars to Python ints/floats/strs so labels are JSON-serialisable."""
    return value.item() if isinstance(value, np.generic) else value
