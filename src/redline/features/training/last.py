"""``last`` outputs: per label row, the last event (by event time, arrival, stable id, first
applied) that had arrived by the row's time, and its value picked straight from the input's own
column, the default where there is none.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from redline.features.tiles import TileWindow
from redline.features.training.decoded import Decoded
from redline.features.training.ids import LabelIds
from redline.features.training.keyed import KeyedEvents, gathered

LAST_STEPS = 8  # steps back over events not yet arrived before the rows left go the long way


def last_arrived(key: np.ndarray, ar: np.ndarray, times: np.ndarray, low: np.ndarray,
                 right: np.ndarray, have: np.ndarray, none: int = -1) -> np.ndarray:
    """Per row, the last event (in ``last`` order) of positions ``< right[i]`` whose key is at
    least ``low[i]`` (its entity and window) that had arrived by ``times[i]``; ``none`` where
    none had.
    Steps back from the range's end over the events that arrive later (few: late events, or
    future ones within the skew); rows with more gather their range."""
    last = right - 1
    at = np.maximum(last, 0)
    valid = have & (last >= 0) & (key[at] >= low) if len(key) else np.zeros(len(last), bool)
    todo = np.flatnonzero(valid & (ar[at] > times)) if len(key) else np.zeros(0, np.int64)
    for _ in range(LAST_STEPS):
        if not len(todo):
            break
        p = last[todo] - 1
        gone = (p < 0) | (key[np.maximum(p, 0)] < low[todo])
        last[todo] = p
        valid[todo[gone]] = False
        todo = todo[~gone]
        todo = todo[ar[last[todo]] > times[todo]]
    if len(todo):  # rows with many events yet to arrive: gather their events
        left = np.searchsorted(key, low[todo])
        for rows, seg, pos in gathered(left, last[todo] - left + 1, ar, times[todo]):
            part = todo[rows]
            n = np.bincount(seg, minlength=len(part))
            ends = np.cumsum(n)
            if len(pos):
                last[part] = pos[np.maximum(ends - 1, 0)]
            valid[part] = n > 0
    return (last - none) * valid + none  # np.where by arithmetic: no branch per row


def put_last(dec: Decoded, ev: KeyedEvents, groups: list[tuple[Any, list[tuple[int, Any]]]],
             out: np.ndarray, rows_by_key: np.ndarray, found: np.ndarray) -> None:
    """``last`` outputs from the position of each row's last arrived event (``found``, in
    :meth:`LabelIds.by_id` order; ``len(ev.sel)``: none): one gather per output from the input's
    own column with the default appended, which a row without an event picks. No mask and no
    negative index: numpy's selections by an unpredictable mask, and its gathers that wrap
    negative positions, cost several times a plain gather."""
    n = dec.rows  # the default's slot: past every input row
    at = np.full(len(out), n, dtype=np.int64)
    if len(found):
        at[rows_by_key] = np.append(ev.files(dec), n).take(found, mode="clip")
    pick_last(dec, groups, out, at)


class SnapshotRows:
    """Per label row (in row order) of a snapshot table (see :func:`snapshot_events`), its entity's
    event: which input row holds it, its time, and whether it had arrived by the row's time."""

    def __init__(self, dec: Decoded, snap: np.ndarray, lab: LabelIds, times: np.ndarray) -> None:
        self.dec, self.lab, self.times = dec, lab, times
        self.none = np.full(len(times), dec.rows, dtype=np.int64)  # the defaults' slot
        self.any = bool(len(dec.index))
        if self.any:
            event = snap.take(lab.codes)  # -1: none
            pick = np.maximum(event, 0)
            self.ts, self.files = dec.ts.take(pick), dec.index.take(pick)
            self.has = (event >= 0) & (dec.arrival.take(pick) <= times)

    def at(self, window: TileWindow) -> np.ndarray:
        """Per row, the input row of its ``last`` in ``window`` (``dec.rows``: none): the event
        if its time is in the range a read merges (:func:`read_bounds`)."""
        if not self.any:
            return self.none
        first, end = self.lab.row_bounds(self.times, window, self.dec.plan.skew_ms)
        valid = self.has & (self.ts >= first) & (self.ts < end)
        n = self.dec.rows
        return (self.files - n) * valid + n  # np.where by arithmetic: no branch per row


def pick_last(dec: Decoded, groups: list[tuple[Any, list[tuple[int, Any]]]], out: np.ndarray,
              at: np.ndarray) -> None:
    """Each ``last`` output's column: the value of the input row ``at`` each row names, or the
    output's default where it names ``dec.rows`` (one past the end)."""
    n = dec.rows
    for g, outs in groups:
        src = dec.fields[g.field].held
        # narrower floats (float32, as Parquet gives them) are picked from as they are, then
        # cast: half the memory to pick from, the same doubles; else doubles, cast as the
        # stores cast them
        wide = (src.dtype == np.float64 or src.dtype.kind != "f"
                or not all(_holds(src.dtype, o.default) for _, o in outs))
        ext = np.empty(n + 1, dtype=np.float64 if wide else src.dtype)
        ext[:-1] = src
        for i, o in outs:
            ext[-1] = o.default
            if wide:
                np.take(ext, at, out=out[:, i], mode="clip")  # in range: clip is unchecked
            else:
                out[:, i] = ext.take(at, mode="clip")


def _holds(dtype: np.dtype, value: float) -> bool:
    """Whether the double ``value`` comes back unchanged from ``dtype`` (NaN as NaN)."""
    back = float(np.asarray(value, dtype=np.float64).astype(dtype))
    return back == value or (math.isnan(back) and math.isnan(value))
