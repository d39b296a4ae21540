"""scikit-learn to ONNX via skl2onnx: estimators, Pipelines, and the sklearn-API LightGBM and
XGBoost models (alone or as a Pipeline's last step)."""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.errors import ConversionError
from redline.models.convert import from_lightgbm, from_xgboost
from redline.models.convert.frameworks import (
    conversion_failed,
    final_estimator,
    import_framework,
    module_root,
)
from redline.models.convert.patches import (
    patch_lightgbm_thresholds,
    patch_skl2onnx_missing_flags,
)
from redline.models.convert.signature import (
    CLASSIFIER_OUTPUTS,
    INPUT_NAME,
    ML_OPSET,
    REGRESSOR_OUTPUTS,
    ConvertedModel,
    plain,
    rename_outputs,
    tabular_result,
)

# Estimators whose trees route NaN down a learned branch, so missing values are legal input.
_NAN_NATIVE = {"HistGradientBoostingClassifier", "HistGradientBoostingRegressor"}


def convert_sklearn_api(model: Any, x: np.ndarray, opset: int, framework: str) -> ConvertedModel:
    """scikit-learn estimators/Pipelines and sklearn-API LightGBM/XGBoost models, via skl2onnx."""
    skl2onnx = import_framework("skl2onnx", "convert")
    from skl2onnx.common.data_types import FloatTensorType

    from_lightgbm.register_sklearn_api()
    from_xgboost.register_sklearn_api()
    patch_skl2onnx_missing_flags()
    final_framework = module_root(type(final_estimator(model)))  # a Pipeline may end in one
    if final_framework == "lightgbm":
        patch_lightgbm_thresholds()
    if final_framework == "xgboost":
        model = from_xgboost.with_plain_feature_names(model)
    final = final_estimator(model)
    is_classifier = hasattr(final, "classes_")
    if is_classifier and not hasattr(model, "predict_proba"):
        raise ConversionError(
            f"{type(final).__name__} has no predict_proba, so its probabilities cannot be checked "
            "or served; enable it (e.g. SVC(probability=True)) or use a calibrated classifier."
        )
    options = {id(final): {"zipmap": False}} if is_classifier else None
    try:
        onx = skl2onnx.convert_sklearn(
            model,
            initial_types=[(INPUT_NAME, FloatTensorType([None, x.shape[1]]))],
            options=options,
            target_opset={"": opset, "ai.onnx.ml": ML_OPSET},
        )
    except Exception as exc:  # converters raise many types; the user needs one clear error
        raise conversion_failed(model, exc) from exc
    outputs = CLASSIFIER_OUTPUTS if is_classifier else REGRESSOR_OUTPUTS
    rename_outputs(onx, outputs)
    labels = [plain(c) for c in final.classes_] if is_classifier else None
    return tabular_result(onx, framework, is_classifier, labels, x, handles_missing(final))


def handles_missing(final: Any) -> bool:
    """Whether the model's trees take NaN as input (boosters and HistGradientBoosting do)."""
    native = module_root(type(final)) in ("lightgbm", "xgboost")
    return native or type(final).__name__ in _NAN_NATIVE
