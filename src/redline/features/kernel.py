"""The old home of the per-partition kernel, kept for one release so that code importing
``redline.features.kernel`` keeps working; it now lives in ``redline.features.training.kernel``.
Import from there: this module will be removed.
"""

from __future__ import annotations

from redline.features.training.kernel import (
    SECONDS_RANGE,
    SEQ,
    apply_transforms,
    build_partition,
    check_milliseconds,
    feature_plan,
    label_ids,
    label_times,
)

__all__ = [
    "SECONDS_RANGE", "SEQ", "apply_transforms", "build_partition", "check_milliseconds",
    "feature_plan", "label_ids", "label_times",
]
