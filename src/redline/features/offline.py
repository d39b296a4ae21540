"""Point-in-time training sets: each label row gets the features the online store would have
answered at its timestamp.

The builder is the online path replayed in event time, not a second implementation of it. By
default it runs by columns (``asof.py``: the decoder's per-value rules over whole columns, the
window's events found by ``searchsorted`` per label row, aggregated with the merge's rules) and
``tests/features/test_asof.py`` holds that to the reference below, event by event: the
events go through the ingest decoder (``events.EventDecoder``: the same types, admission, value
identity and tie rule) and the memory store (``aggregates.NumericTile``: the same merge), in
arrival order; before each label row's time ``t`` every event that had *arrived* by ``t``
(``_arrival_ms`` column; without it, arrival = event time) is applied, then the row is read at
``t``. An event counts for a row exactly when it would have counted online.

Files are read without letting pandas guess types (JSON lines by orjson, CSV as text decoded like
a Redis Stream entry), so the answer does not depend on the pandas version.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from redline.errors import InvalidInput
from redline.features.definitions import FeatureDefinitions, FeatureView

# Event files and arrival times live in ``eventfile`` (no pandas); the builder reads them too.
from redline.features.eventfile import (  # noqa: F401 - public here too
    ARRIVAL,
    EventLog,
    arrival_of,
    existing_file,
    read_events,
    text_log,
)
from redline.features.events import EventDecoder
from redline.features.frames import frame_events  # noqa: F401 - public here too
from redline.features.online.memory import MemoryStore


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


def _as_log(events: pd.DataFrame | EventLog | Sequence[Any]) -> EventLog:
    if isinstance(events, EventLog):
        return events
    if isinstance(events, pd.DataFrame):
        return EventLog(frame_events(events))
    return EventLog(list(events))


def _arrivals(raws: list[Any], decoder: EventDecoder) -> tuple[list[Any], list[int]]:
    """Parsed events and their arrival times (``_arrival_ms``, else the event time, else 0: such
    an event is dead-lettered by the decoder anyway)."""
    parsed: list[Any] = []
    arrivals: list[int] = []
    for raw in raws:
        obj = raw
        if isinstance(raw, bytes | str):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                obj = raw  # the decoder dead-letters it with the parse error
        parsed.append(obj)
        arrivals.append(arrival_of(obj, decoder))
    return parsed, arrivals


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

    The whole input is one partition of :func:`redline.features.kernel.build_partition`, the
    function every engine runs. ``method``: ``"columns"`` (the vectorised replay of
    ``asof.py``), ``"replay"`` (event by event through the decoder and a memory store: the
    reference), ``"auto"`` (columns where the input allows, else replay). ``threads``: sources
    built at once (default: one per core)."""
    import os

    from redline.features.kernel import build_partition

    return build_partition(defs, events, labels, features, time_column=time_column,
                           method=method, threads=threads or os.cpu_count() or 1)


def point_in_time(defs: FeatureDefinitions, views: Sequence[FeatureView],
                  events: pd.DataFrame | EventLog | Sequence[Any], times: np.ndarray,
                  ids: Mapping[str, Sequence[str]], method: str = "auto"
                  ) -> dict[str, np.ndarray]:
    """Per view, (rows, outputs) float64 values at ``times`` for ``ids`` (see ``method`` of
    :func:`build_training_set`)."""
    if method not in ("auto", "columns", "replay"):
        raise InvalidInput(f"unknown method {method!r} (use auto, columns or replay)")
    if method != "replay" and len({v.source.name for v in views}) == 1:
        from redline.features.training.decoded import Decoded
        from redline.features.training.values import view_values

        dec = Decoded(EventDecoder(defs, views[0].source.name, views), events)
        if dec.ready:
            return {v.name: view_values(dec, v, times, ids[v.name]) for v in views}
    if method == "columns":
        raise InvalidInput("these events need the event-by-event replay (several sources, "
                           "nested or Redis Stream entries): use method='replay' or 'auto'")
    return replay_values(defs, views, _as_log(events), times, ids)


def replay_values(defs: FeatureDefinitions, views: Sequence[FeatureView], log: EventLog,
                  times: np.ndarray, ids: Mapping[str, Sequence[str]], batch: int = 4096
                  ) -> dict[str, np.ndarray]:
    """Per view, the (rows, outputs) float64 values a memory store fed ``log`` in arrival order
    answers for entity ``ids[view][i]`` at ``times[i]``."""
    sources = {v.source.name for v in views}
    decoder = EventDecoder(defs, next(iter(sources)) if len(sources) == 1 else None, views)
    parsed, arrivals = _arrivals(log.raws, decoder)
    order = sorted(range(len(parsed)), key=arrivals.__getitem__)  # stable: file order on ties
    store = MemoryStore()
    readers = {v.name: store.reader([v]) for v in views}
    out = {v.name: np.empty((len(times), len(v.layout().outputs))) for v in views}
    rows = np.argsort(times, kind="stable")
    i = 0
    r = 0
    while r < len(rows):
        now = int(times[rows[r]])
        end = r
        while end < len(rows) and times[rows[end]] == now:
            end += 1
        while i < len(order) and arrivals[order[i]] <= now:
            j = i
            while j < len(order) and j - i < batch and arrivals[order[j]] <= now:
                j += 1
            chunk = order[i:j]
            decoded = decoder.decode([parsed[k] for k in chunk], [arrivals[k] for k in chunk],
                                     chunk, flat=log.flat)
            store.write(decoded, wall_ms=arrivals[order[j - 1]])
            i = j
        picked = rows[r:end]
        for view in views:
            vid = ids[view.name]
            vals, _ = readers[view.name].read([vid[k] for k in picked], now, dtype=np.float64)
            out[view.name][picked] = vals
        r = end
    return out


def isclose(a: float, b: float, rel: float = 1e-9, abs_tol: float = 1e-9) -> bool:
    """The skew tolerance: exact for integers, 1e-9 relative for floats (NaN equals NaN)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)
