"""The caller's sample: the rows a conversion is run and checked on, read as float32."""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.errors import ConversionError
from redline.models.convert.from_lightgbm import is_booster


def as_sample(sample: Any, framework: str) -> np.ndarray:
    """The sample as a C-contiguous float32 array; 2-D except for PyTorch."""
    try:
        x = np.ascontiguousarray(np.asarray(sample, dtype=np.float32))
    except (TypeError, ValueError) as exc:
        raise ConversionError(
            f"the sample cannot be read as float32 numbers ({exc}); pass numeric rows."
        ) from exc
    if x.ndim < 2 or (framework != "pytorch" and x.ndim != 2) or x.shape[0] == 0:
        raise ConversionError(
            f"the sample has shape {x.shape}; pass a non-empty 2-D array [rows, features]"
            + (" (or higher rank for PyTorch)" if framework == "pytorch" else "")
            + " of representative inputs."
        )
    return x


def check_n_features(model: Any, x: np.ndarray) -> None:
    """The sample's width must be the width the model was trained on."""
    expected = getattr(model, "n_features_in_", None)
    if expected is None and is_booster(model):
        expected = model.num_feature()
    if expected is not None and int(expected) != x.shape[1]:
        raise ConversionError(
            f"the sample has {x.shape[1]} features per row but the model was trained on "
            f"{int(expected)}; pass rows with the training features in training order."
        )
