"""MLflow models into the repository: a logged model folder, ``runs:/…`` or ``models:/…``.

The scikit-learn, LightGBM, XGBoost and PyTorch flavors are converted to ONNX with the usual
parity check, run on the model's input example (or ``--sample``); an ``onnx`` flavor is taken as
it is; ``pyfunc`` becomes a Python model. Feature names come from the MLflow signature.

One module per step: ``mlflow_store`` finds and copies the model, ``mlflow_flavors`` loads a
flavor's object (running no code from the model unless trusted), ``mlflow_pyfunc`` stages a
pyfunc as a Python model; this module picks the flavor and the rows, and adds the version.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.errors import ConversionError, InvalidInput
from redline.models.convert.frameworks import import_framework
from redline.models.convert.mlflow_flavors import load_native
from redline.models.convert.mlflow_pyfunc import add_pyfunc
from redline.models.convert.mlflow_store import (
    PYFUNC_HINT,
    MlflowModel,
    open_model,
    sample_word,
)

if TYPE_CHECKING:
    from redline.models.metadata import ModelMetadata
    from redline.models.repository import ModelRepository

CONVERTIBLE = ("sklearn", "lightgbm", "xgboost", "pytorch", "onnx")  # picked in this order
FLAVORS = (*CONVERTIBLE, "pyfunc")
PYFUNC = "python_function"
_NUMERIC_COLUMNS = ("boolean", "integer", "long", "float", "double")


def add_from_mlflow(
    repo: ModelRepository,
    name: str,
    uri: str,
    *,
    tracking_uri: str | None = None,
    flavor: str | None = None,
    sample: Any = None,
    trust_pickle: bool = False,
    trust_code: bool = False,
    tolerance: float = 1e-4,
    feature_names: list[str] | None = None,
    runtime: str | None = None,
    timeout_s: float = 60.0,
    **kwargs: Any,
) -> ModelMetadata:
    """Add the MLflow model at ``uri`` as a new version of ``name``.

    ``flavor`` picks one (default: the first convertible one the model has); ``sample`` replaces
    the input example for the parity check and the drift profile; ``feature_names`` the names
    the signature gives. ``runtime`` and ``timeout_s`` apply to a pyfunc (a Python model).
    ``kwargs`` go on to ``ModelRepository.add_estimator``/``add_onnx``/``add_python``
    (``version``, ``description``, ``task``, ``class_labels``, ``missing_values``).
    """
    import_framework("mlflow", "mlflow")
    with tempfile.TemporaryDirectory(prefix="redline-mlflow-") as tmp:
        model = open_model(uri, tracking_uri, Path(tmp))
        chosen = choose_flavor(model, flavor)
        model.info["flavor"] = chosen
        model.info["sample"] = "input example" if sample is None else "--sample"
        extra = {**dict(kwargs.pop("extra", None) or {}), "mlflow": model.info}
        if chosen == "pyfunc":
            return add_pyfunc(repo, name, model, sample, Path(tmp), trust_code=trust_code,
                              feature_names=feature_names, runtime=runtime,
                              timeout_s=timeout_s, extra=extra, **kwargs)
        x, names = parity_sample(model, sample, chosen)
        names = feature_names or names
        if chosen == "onnx":
            data = (model.folder / model.flavors["onnx"]["data"]).read_bytes()
            return repo.add_onnx(name, data, feature_names=names, sample=x, framework="onnx",
                                 extra=extra, **kwargs)
        native = load_native(model, chosen, trust_pickle)
        with warnings.catch_warnings():
            # an exported PyTorch program checks its batch size; the trace keeps it dynamic
            warnings.filterwarnings("ignore", message="Converting a tensor to a Python boolean")
            # the parity check feeds rows; a model fitted on a DataFrame notes the missing names
            warnings.filterwarnings("ignore", message="X does not have valid feature names")
            try:
                return repo.add_estimator(name, native, x, tolerance=tolerance,
                                          feature_names=names, extra=extra, **kwargs)
            except ConversionError as exc:
                if "tolerance" in exc.details:  # a parity refusal says what to do already
                    raise
                raise ConversionError(f"{exc.message} (the {chosen} flavor of {uri}); or "
                                      f"{PYFUNC_HINT}", **exc.details) from exc


def choose_flavor(model: MlflowModel, requested: str | None) -> str:
    """The flavor to import: ``requested``, else the first convertible one the model has."""
    have = [("pyfunc" if f == PYFUNC else f) for f in model.flavors]
    if requested is not None:
        wanted = "pyfunc" if requested == PYFUNC else requested
        if wanted not in have:
            raise InvalidInput(f"--from-mlflow {model.uri} has no {wanted} flavor (it has "
                               f"{', '.join(have)})")
        return wanted
    for candidate in CONVERTIBLE:
        if candidate in have:
            return candidate
    others = [f for f in have if f != "pyfunc"]
    what = f"the {', '.join(others)} flavor" if others else "only the pyfunc flavor"
    hint = (PYFUNC_HINT if "pyfunc" in have
            else "log it with one of those flavors or as an ONNX model")
    raise ConversionError(
        f"--from-mlflow {model.uri} has {what}, which redline cannot convert to ONNX (it "
        f"converts {', '.join(CONVERTIBLE[:-1])} and takes onnx as it is); {hint}")


def parity_sample(model: MlflowModel, sample: Any, flavor: str
                  ) -> tuple[np.ndarray, list[str] | None]:
    """The rows the conversion is checked on (``sample``, else the input example) as float32,
    and the feature names the signature gives them."""
    names, width = signature_columns(model, flavor)
    if sample is None:
        if model.input_example is None:
            missing = "an input example" if model.signature is not None else (
                "a signature or an input example")
            raise InvalidInput(
                f"--from-mlflow {model.uri} was logged without {missing}, so there are no rows "
                "to check the conversion on: pass --sample ROWS (.npz, .npy, .csv or .parquet "
                "with representative inputs), or log the model with input_example=")
        rows = example_rows(model, names)
    else:
        rows = sample
    try:
        x = np.ascontiguousarray(np.asarray(rows, dtype=np.float32))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"--from-mlflow {model.uri}: the {sample_word(sample)} cannot be "
                           f"read as numbers ({exc}); pass --sample ROWS") from exc
    if x.ndim == 1 and flavor != "pytorch":
        x = x.reshape(1, -1)
    if width is not None and (x.ndim < 2 or x.shape[1] != width):
        raise InvalidInput(
            f"--from-mlflow {model.uri}: the {sample_word(sample)} has shape {x.shape} but the "
            f"MLflow signature takes {width} inputs per row"
            + (f" ({', '.join(names)})" if names else ""))
    return x, names


def signature_columns(model: MlflowModel, flavor: str) -> tuple[list[str] | None, int | None]:
    """Feature names and row width from the signature (``None`` where it does not say); a clear
    error for inputs that are no matrix of numbers."""
    signature = model.signature
    if signature is None or signature.inputs is None:
        return None, None
    schema = signature.inputs
    if schema.is_tensor_spec():
        specs = schema.inputs
        if len(specs) != 1:
            raise ConversionError(
                f"--from-mlflow {model.uri} takes {len(specs)} tensors "
                f"({', '.join(str(s.name) for s in specs)}); redline converts models with one "
                f"input; {PYFUNC_HINT}")
        spec = specs[0]
        if spec.type.kind not in "biuf":
            raise ConversionError(f"--from-mlflow {model.uri} takes {spec.type} tensors, not "
                                  f"numbers; {PYFUNC_HINT}")
        shape = list(spec.shape)
        if flavor != "pytorch" and len(shape) != 2:
            raise ConversionError(f"--from-mlflow {model.uri} takes tensors of shape {shape}; "
                                  f"a {flavor} model takes rows [batch, features]")
        return None, (shape[1] if len(shape) >= 2 and shape[1] > 0 else None)
    names, bad = [], []
    for col in schema.inputs:
        kind = getattr(col.type, "name", str(col.type))
        names.append(str(col.name))
        if kind not in _NUMERIC_COLUMNS:
            bad.append(f"{col.name} ({kind})")
    if bad:
        raise ConversionError(
            f"--from-mlflow {model.uri} takes columns that are not numbers: {', '.join(bad)}; "
            f"an ONNX conversion takes a matrix of numbers; {PYFUNC_HINT}")
    if not schema.has_input_names():
        return None, len(names)
    return names, len(names)


def example_rows(model: MlflowModel, names: list[str] | None) -> Any:
    """The input example as rows in signature order."""
    example = model.input_example
    if hasattr(example, "columns"):  # a DataFrame: columns by name, in the signature's order
        if names:
            missing = [n for n in names if n not in example.columns]
            if missing:
                raise InvalidInput(f"--from-mlflow {model.uri}: the input example lacks the "
                                   f"signature's columns {missing}; pass --sample ROWS")
            example = example[names]
        return example.to_numpy()
    if isinstance(example, dict):
        if len(example) != 1:
            raise ConversionError(
                f"--from-mlflow {model.uri}: its input example has several inputs "
                f"({', '.join(map(str, example))}); redline converts models with one input; "
                f"{PYFUNC_HINT}")
        return next(iter(example.values()))
    return example
