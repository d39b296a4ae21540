"""Which framework a model comes from, found without importing any framework for it.

Framework libraries are imported lazily, through :func:`import_framework`, so ``redline``
without the ``convert``/``torch`` extras still imports the converters; a missing one becomes a
``ConversionError`` that names the extra to install.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from redline.errors import ConversionError

SUPPORTED_FRAMEWORKS = ("scikit-learn", "lightgbm", "xgboost", "pytorch", "keras", "tensorflow",
                        "onnx")


def detect_framework(model: Any) -> str:
    """Name the framework ``model`` comes from, or raise ``ConversionError`` if unsupported.

    Detection looks at the class's module (and its bases) so no framework is imported for it. A
    path is a Keras ``.keras`` file or a TensorFlow SavedModel folder.
    """
    if isinstance(model, (bytes, bytearray)) or module_root(type(model)) == "onnx":
        return "onnx"
    if isinstance(model, (str, os.PathLike)):
        return _file_framework(Path(model))
    for klass in type(model).__mro__:
        root = module_root(klass)
        if root == "sklearn":
            return "scikit-learn"
        if root == "lightgbm":
            return "lightgbm"
        if root == "xgboost":
            return "xgboost"
        if root == "torch":
            return "pytorch"
        if root == "keras":
            return "keras"
        if root == "tensorflow" and hasattr(model, "signatures"):  # tf.saved_model.load(...)
            return "tensorflow"
    raise ConversionError(
        f"cannot convert a {type(model).__module__}.{type(model).__qualname__}: supported "
        f"frameworks are {', '.join(SUPPORTED_FRAMEWORKS)} (scikit-learn estimators and "
        "Pipelines, LightGBM, XGBoost, PyTorch nn.Module, a Keras model or .keras file, a "
        "TensorFlow SavedModel folder, or an ONNX model). Convert it to ONNX yourself and add "
        "the .onnx file instead.",
        model_type=type(model).__qualname__,
    )


def is_saved_model(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a TensorFlow SavedModel folder (what TF Serving serves)."""
    folder = Path(path)
    return (folder / "saved_model.pb").is_file() or (folder / "saved_model.pbtxt").is_file()


def _file_framework(path: Path) -> str:
    if path.suffix == ".keras" and path.is_file():
        return "keras"
    if is_saved_model(path):
        return "tensorflow"
    raise ConversionError(
        f"cannot convert {path}: a model file to convert is a Keras .keras file or a TensorFlow "
        "SavedModel folder (one with saved_model.pb); pass other models as objects, or add an "
        ".onnx file as it is.",
        model_type="path",
    )


def module_root(klass: type) -> str:
    """The top-level package a class is defined in (``sklearn``, ``lightgbm``, ...)."""
    return (getattr(klass, "__module__", "") or "").split(".")[0]


def final_estimator(model: Any) -> Any:
    """The last step of a (possibly nested) Pipeline, or the model itself."""
    while hasattr(model, "steps"):
        model = model.steps[-1][1]
    return model


def framework_version(framework: str) -> str:
    module = {"scikit-learn": "sklearn", "lightgbm": "lightgbm", "xgboost": "xgboost"}[framework]
    return str(import_framework(module, "convert").__version__)


def import_framework(module: str, extra: str) -> Any:
    """``module``, or a ``ConversionError`` that says to install ``redline[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConversionError(
            f"converting this model needs the '{module}' package: pip install 'redline[{extra}]'"
        ) from exc


def conversion_failed(model: Any, exc: Exception) -> ConversionError:
    """One clear error for whatever a third-party converter raised."""
    return ConversionError(
        f"converting {type(model).__name__} to ONNX failed: {str(exc).rstrip('.')}. Check that "
        "every step of the model is supported by skl2onnx/onnxmltools/torch.onnx, or add an "
        "ONNX file instead.",
        model_type=type(model).__name__,
    )
