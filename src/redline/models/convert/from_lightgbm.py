"""LightGBM to ONNX: a raw ``Booster`` through onnxmltools, the sklearn-API models through
skl2onnx (registered here, so a Pipeline that ends in one converts too)."""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.models.convert.frameworks import conversion_failed, import_framework, module_root
from redline.models.convert.patches import patch_lightgbm_thresholds
from redline.models.convert.signature import (
    BOOSTER_MAX_OPSET,
    CLASSIFIER_OUTPUTS,
    INPUT_NAME,
    REGRESSOR_OUTPUTS,
    ConvertedModel,
    rename_outputs,
    tabular_result,
)

_REGISTERED = False


def is_booster(model: Any) -> bool:
    """A raw ``lightgbm.Booster`` (not an ``LGBMClassifier``/``LGBMRegressor``)."""
    return module_root(type(model)) == "lightgbm" and type(model).__name__ == "Booster"


def convert_booster(booster: Any, x: np.ndarray, opset: int) -> ConvertedModel:
    """A raw ``lightgbm.Booster`` (no sklearn wrapper) via onnxmltools, without ZipMap."""
    onnxmltools = import_framework("onnxmltools", "convert")
    from onnxmltools.convert.common.data_types import FloatTensorType

    n_classes = booster_classes(booster)
    patch_lightgbm_thresholds()
    try:
        onx = onnxmltools.convert_lightgbm(
            booster,
            initial_types=[(INPUT_NAME, FloatTensorType([None, x.shape[1]]))],
            target_opset=min(opset, BOOSTER_MAX_OPSET),
            zipmap=False,
        )
    except Exception as exc:
        raise conversion_failed(booster, exc) from exc
    is_classifier = n_classes is not None
    rename_outputs(onx, CLASSIFIER_OUTPUTS if is_classifier else REGRESSOR_OUTPUTS)
    labels = list(range(n_classes)) if n_classes is not None else None
    return tabular_result(onx, "lightgbm", is_classifier, labels, x, True)


def booster_classes(booster: Any) -> int | None:
    """Number of classes of a raw Booster (None for regression), read from its objective."""
    objective = str(booster.dump_model().get("objective", "")).split(" ")[0]
    if objective in ("binary", "cross_entropy", "xentropy"):
        return 2
    if objective.startswith("multiclass") or objective in ("softmax", "multiclassova"):
        return int(booster.dump_model().get("num_class", 1))
    return None


def register_sklearn_api() -> None:
    """Teach skl2onnx ``LGBMClassifier``/``LGBMRegressor`` (once; nothing without lightgbm)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from skl2onnx import update_registered_converter
    from skl2onnx.common.shape_calculator import (
        calculate_linear_classifier_output_shapes,
        calculate_linear_regressor_output_shapes,
    )

    try:
        from lightgbm import LGBMClassifier, LGBMRegressor
        from onnxmltools.convert.lightgbm.operator_converters.LightGbm import convert_lightgbm

        update_registered_converter(
            LGBMClassifier,
            "LightGbmLGBMClassifier",
            calculate_linear_classifier_output_shapes,
            convert_lightgbm,
            options={"nocl": [True, False], "zipmap": [True, False, "columns"]},
        )
        update_registered_converter(
            LGBMRegressor,
            "LightGbmLGBMRegressor",
            calculate_linear_regressor_output_shapes,
            convert_lightgbm,
            options={"split": None},
        )
    except ImportError:
        pass
    _REGISTERED = True
