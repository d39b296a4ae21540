"""Point-in-time training sets: each label row gets the features the online store would have
answered at its timestamp.

The builder is the online path replayed in event time, not a second implementation of it. By
default it runs by columns (``training/``: the decoder's per-value rules over whole columns, the
window's events found by ``searchsorted`` per label row, aggregated with the merge's rules) and
``tests/features/test_asof.py`` holds that to the reference, event by event through the ingest
decoder and a memory store (``training/replay.py``). An event counts for a row exactly when it
would have counted online.

This module is the in-memory engine and the public entry (``build_training_set``, the table
readers); the one per-partition kernel it runs is ``training.kernel``, which the engines import
and which imports none of them.

Files are read without letting pandas guess types (JSON lines by orjson, CSV as text decoded like
a Redis Stream entry), so the answer does not depend on the pandas version.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from redline.errors import InvalidInput
from redline.features.definitions import FeatureDefinitions

# Event files and arrival times live in ``eventfile`` (no pandas); the builder reads them too.
from redline.features.eventfile import (  # noqa: F401 - public here too
    ARRIVAL,
    EventLog,
    arrival_of,
    existing_file,
    read_events,
    text_log,
)
from redline.features.frames import frame_events  # noqa: F401 - public here too
from redline.features.training.kernel import build_partition
from redline.features.training.replay import replay_values  # noqa: F401 - public here too
from redline.features.training.values import point_in_time  # noqa: F401 - public here too


def read_table(path: str | Path, text_columns: Collection[str] = ()) -> pd.DataFrame:
    """JSONL, CSV or Parquet → DataFrame (by extension); for label tables. The CSV columns in
    ``text_columns`` (entity ids: ``007`` is not ``7``) are read as text, the others typed."""
    p = existing_file(path)
    suffix = p.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson", ".json"):
            return pd.DataFrame([orjson.loads(ln) for ln in p.read_bytes().splitlines()
                                 if ln.strip()])
        if suffix == ".csv":
            return pd.read_csv(p, dtype={c: str for c in text_columns} or None)
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(p)
    except (ValueError, OSError, orjson.JSONDecodeError) as exc:
        raise InvalidInput(f"cannot read {p}: {exc}") from exc
    raise InvalidInput(f"{p}: unknown table format '{suffix}' (use .jsonl, .csv or .parquet)")


def read_event_table(path: str | Path) -> pd.DataFrame | EventLog:
    """An event file for the training-set builder, read as ``redline ingest file`` reads it:
    CSV as text cells (``007`` and ``7`` are two entities, ``3`` is a ``str`` field's value),
    JSON lines and Parquet as frames."""
    if Path(path).suffix.lower() == ".csv":
        return read_events(path)
    return read_table(path)


def label_keys(defs: FeatureDefinitions) -> list[str]:
    """The entity id columns label rows may carry: read as text from CSV, like event ids."""
    return sorted({v.entity.join_key for v in defs.views.values()})


def build_training_set(
    defs: FeatureDefinitions,
    events: pd.DataFrame | Mapping[str, pd.DataFrame] | EventLog | Sequence[Any],
    labels: pd.DataFrame, features: Sequence[str] | None = None, *, time_column: str = "ts",
    method: str = "auto", threads: int | None = None,
) -> pd.DataFrame:
    """``labels`` (entity id column(s) named by join key, ``time_column`` in epoch ms, anything
    else passed through) + one float64 column per feature / transform, point-in-time correct.
    ``events``: one frame (a ``source`` column when several sources), a dict of one frame per
    source name, an ``EventLog`` or event dicts.

    The whole input is one partition of :func:`redline.features.training.kernel.build_partition`,
    the function every engine runs. ``method``: ``"columns"`` (the vectorised replay of
    ``training/``), ``"replay"`` (event by event through the decoder and a memory store: the
    reference), ``"auto"`` (columns where the input allows, else replay). ``threads``: sources
    built at once (default: one per core)."""
    return build_partition(defs, events, labels, features, time_column=time_column,
                           method=method, threads=threads or os.cpu_count() or 1)


def isclose(a: float, b: float, rel: float = 1e-9, abs_tol: float = 1e-9) -> bool:
    """The skew tolerance: exact for integers, 1e-9 relative for floats (NaN equals NaN)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)
