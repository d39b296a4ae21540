"""XGBoost to ONNX: ``XGBClassifier``/``XGBRegressor`` go through skl2onnx, with onnxmltools'
XGBoost converter registered for them here (so a Pipeline that ends in one converts too)."""

from __future__ import annotations

import copy
from typing import Any

from redline.models.convert.frameworks import final_estimator

_REGISTERED = False


def register_sklearn_api() -> None:
    """Teach skl2onnx ``XGBClassifier``/``XGBRegressor`` (once; nothing without xgboost)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from skl2onnx import update_registered_converter
    from skl2onnx.common.shape_calculator import (
        calculate_linear_classifier_output_shapes,
        calculate_linear_regressor_output_shapes,
    )

    try:
        from onnxmltools.convert.xgboost.operator_converters.XGBoost import convert_xgboost
        from xgboost import XGBClassifier, XGBRegressor

        update_registered_converter(
            XGBClassifier,
            "XGBoostXGBClassifier",
            calculate_linear_classifier_output_shapes,
            convert_xgboost,
            options={"nocl": [True, False], "zipmap": [True, False, "columns"]},
        )
        update_registered_converter(
            XGBRegressor,
            "XGBoostXGBRegressor",
            calculate_linear_regressor_output_shapes,
            convert_xgboost,
        )
    except ImportError:
        pass
    _REGISTERED = True


def with_plain_feature_names(model: Any) -> Any:
    """A copy whose booster uses the f0..fN names onnxmltools parses (training on a DataFrame
    stores the column names in the tree dump instead)."""
    final = final_estimator(model)
    booster = final.get_booster()
    if not booster.feature_names:
        return model
    model = copy.deepcopy(model)
    booster = final_estimator(model).get_booster()
    booster.feature_names = None
    booster.feature_types = None
    return model
