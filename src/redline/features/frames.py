"""DataFrame cells and rows as the decoder gets them: a missing cell (None/NaN/NaT) is an absent
field, numpy scalars are Python ones (the decoder then applies the schema types).

Apart from ``eventfile`` so that its readers import pandas only when they read a Parquet file.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def frame_value(v: Any) -> Any:
    """A DataFrame cell as the decoder gets it: a missing cell (None/NaN/NaT) is ``None``, numpy
    scalars become Python ones."""
    if v is None or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "item") and not isinstance(v, str | bytes):
        return v.item()
    return v


def frame_events(df: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame rows as event dicts: a missing cell (NaN/None/NaT) is an absent field, numpy
    scalars become Python ones (the decoder then applies the schema types)."""
    out = []
    for rec in df.to_dict("records"):
        ev = {}
        for k, v in rec.items():
            v = frame_value(v)
            if v is not None:
                ev[str(k)] = v
        out.append(ev)
    return out
