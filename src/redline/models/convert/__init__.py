"""Convert a trained model to ONNX and prove the conversion agrees with the original.

Every model enters the repository as ONNX (see DESIGN.md: ONNX Runtime is the one engine). A
conversion is only accepted after the original framework and ONNX Runtime have both run on the
caller's sample and agree within a tolerance; otherwise ``ConversionError`` says where they
differ most and what to do. Framework libraries are imported lazily, so ``redline`` without the
``convert``/``torch``/``tensorflow`` extras still imports this package.

One module per idea:

- ``frameworks``: which framework a model comes from; lazy imports with an install hint;
- ``signature``: the canonical ONNX signature (``input`` in; ``label`` + ``probabilities``,
  ``variable`` or ``output`` out) and :class:`ConvertedModel`;
- ``sample``: the caller's sample rows, read as float32 and checked against the model;
- ``from_sklearn``, ``from_lightgbm``, ``from_xgboost``, ``from_torch``, ``from_onnx``: one
  converter per framework; ``from_tensorflow`` (a SavedModel's ``serving_default``) and
  ``from_keras`` (a ``.keras`` file) keep their signature's names, several inputs allowed;
- ``patches``: fixes applied to skl2onnx/onnxmltools before they run;
- ``parity``: both sides run the sample, and must agree.
"""

from __future__ import annotations

from typing import Any

from redline.models.convert.frameworks import (
    SUPPORTED_FRAMEWORKS,
    detect_framework,
    is_saved_model,
)
from redline.models.convert.from_keras import keras_serving
from redline.models.convert.from_lightgbm import convert_booster, is_booster
from redline.models.convert.from_onnx import load_onnx
from redline.models.convert.from_sklearn import convert_sklearn_api
from redline.models.convert.from_tensorflow import convert_serving, saved_model_serving
from redline.models.convert.from_torch import convert_torch
from redline.models.convert.parity import check_parity
from redline.models.convert.sample import as_sample, check_n_features
from redline.models.convert.signature import (
    BOOSTER_MAX_OPSET,
    CLASSIFIER_OUTPUTS,
    DEFAULT_OPSET,
    INPUT_NAME,
    ML_OPSET,
    REGRESSOR_OUTPUTS,
    TORCH_OUTPUTS,
    ConvertedModel,
)

__all__ = [
    "BOOSTER_MAX_OPSET",
    "CLASSIFIER_OUTPUTS",
    "DEFAULT_OPSET",
    "INPUT_NAME",
    "ML_OPSET",
    "REGRESSOR_OUTPUTS",
    "SUPPORTED_FRAMEWORKS",
    "TORCH_OUTPUTS",
    "ConvertedModel",
    "convert",
    "detect_framework",
    "is_saved_model",
]


def convert(
    model: Any, sample: Any, *, tolerance: float = 1e-4, opset: int | None = None
) -> ConvertedModel:
    """Convert ``model`` to ONNX and check it against the original on ``sample``.

    ``sample`` is representative input rows (cast to float32; for a Keras or TensorFlow model,
    to each input's dtype, and a mapping of input name to rows when it has several inputs). A
    Keras model may be given as its ``.keras`` path, a SavedModel as its folder. Outputs are
    compared elementwise; a difference counts as ``|onnx - original| / max(1, |original|)`` so
    that regressors with large targets are judged relatively and probabilities absolutely. Raises
    ``ConversionError`` when they differ by more than ``tolerance``. Typical real refusal: a
    Pipeline that scales in float32 before trees moves a value across a split for some row.
    """
    framework = detect_framework(model)
    target = opset or DEFAULT_OPSET
    if framework in ("keras", "tensorflow"):  # named inputs: their own sample and parity check
        serving = keras_serving(model) if framework == "keras" else saved_model_serving(model)
        return convert_serving(serving, sample, tolerance, target)
    x = as_sample(sample, framework)
    if framework == "pytorch":
        converted = convert_torch(model, x, target)
    elif framework == "onnx":
        converted = load_onnx(model, x)  # taken as given: nothing to compare it with
    else:
        check_n_features(model, x)
        if framework == "lightgbm" and is_booster(model):
            converted = convert_booster(model, x, target)
        else:
            converted = convert_sklearn_api(model, x, target, framework)
    if framework != "onnx":
        converted.max_abs_diff = check_parity(model, converted, x, tolerance)
    return converted
