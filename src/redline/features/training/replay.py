"""The reference path: a view set's values from the events replayed one by one, in arrival order,
through the ingest decoder (``events.EventDecoder``: the same types, admission, value identity
and tie rule) and a memory store (``aggregates.NumericTile``: the same merge). Before each label
row's time ``t`` every event that had *arrived* by ``t`` (``_arrival_ms`` column; without it,
arrival = event time) is applied, then the row is read at ``t``: an event counts for a row exactly
when it would have counted online. The column path (``values``) is held to this replay by
``tests/features/test_asof.py`` and takes every input it can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pandas as pd

from redline.features.definitions import FeatureDefinitions, FeatureView
from redline.features.eventfile import EventLog, arrival_of
from redline.features.events import EventDecoder
from redline.features.frames import frame_events
from redline.features.online.memory import MemoryStore


def as_log(events: pd.DataFrame | EventLog | Sequence[Any]) -> EventLog:
    """Events of any accepted shape as a log: a frame's rows become event dicts."""
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
