"""The old home of the column path of the training-set builder, kept for one release so that
code importing ``redline.features.asof`` keeps working; it now lives in
``redline.features.training`` (``columns``, ``ids``, ``decoded``, ``keyed``, ``last``,
``aggregates``, ``values``). Import from there: this module will be removed.
"""

from __future__ import annotations

from redline.features.eventfile import ARRIVAL
from redline.features.frames import frame_value
from redline.features.training.columns import Column, Field, columns, times_ms
from redline.features.training.decoded import Decoded
from redline.features.training.ids import (
    Ids,
    LabelIds,
    as_int64,
    factorize_ints,
    id_table,
    stable_argsort,
)
from redline.features.training.values import view_values

__all__ = [
    "ARRIVAL", "Column", "Decoded", "Field", "Ids", "LabelIds", "as_int64", "columns",
    "factorize_ints", "frame_value", "id_table", "stable_argsort", "times_ms", "view_values",
]
