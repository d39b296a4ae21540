"""The embedded online store: tile rings in Python dicts, one process, no services.

Reads are served from a per-entity result: the merged window records for the current tiles.
A write whose tile lies inside a cached window folds its value into that merged record (the
slot it replaces always holds a tile older than every window, so nothing has to be removed); a
new current tile recomputes from the tiles. Reads are therefore a copy almost always, and a
value equals the fresh merge of the tiles up to float rounding (counts exactly).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from redline.features.aggregates import (
    EMPTY_RECORD,
    LT,
    N,
    NumericTile,
    hll_estimate,
    record_update,
)
from redline.features.definitions import FeatureView
from redline.features.layout import ViewLayout
from redline.features.online.base import EntityIds, ReadPlan, now_ms
from redline.features.online.bulk import BulkLoader
from redline.features.online.keystate import KeyState
from redline.features.updates import Rejected, UpdateBatch


def merge_windows(state: KeyState, layout: ViewLayout, now: int) -> None:
    """Merge the tiles covering ``now`` for each window into ``state.merged`` with the partial
    aggregates' own ``merge`` (``aggregates.NumericTile``: the one definition of a merge)."""
    merged: list[Any] = []
    ranges = []
    for w in layout.windows:
        lo, hi = w.window.covering(now)
        ranges.append((lo, hi))
        ring = state.rings.get(w.gid, ())
        if layout.groups[w.gid].hll:
            regs = bytearray(256)
            for entry in ring:
                if entry is not None and lo <= entry[0] <= hi:
                    for i, r in enumerate(entry[1]):
                        if r > regs[i]:
                            regs[i] = r
            merged.append(regs)
            continue
        acc = NumericTile()
        for entry in ring:
            if entry is not None and lo <= entry[0] <= hi:
                acc.merge(entry[1])
        merged.append(acc)
    state.merged, state.ranges, state.out = merged, ranges, None


def outputs(state: KeyState, layout: ViewLayout) -> np.ndarray:
    out = state.out
    if out is None:
        out = np.empty(len(layout.outputs), dtype=np.float64)
        for i, o in enumerate(layout.outputs):
            m = state.merged[o.wid]
            if o.kind == "distinct":
                out[i] = hll_estimate(m, len(m)) if any(m) else 0.0
            else:
                out[i] = m.value(o.kind, o.default)
        state.out = out
    return out


def newest_event(state: KeyState) -> float:
    """The greatest event time (``last``'s) of the numeric windows merged for the last read."""
    best = -math.inf
    for m in state.merged:
        if isinstance(m, NumericTile) and m[N] > 0 and m[LT] > best:
            best = m[LT]
    return best if best != -math.inf else math.nan


class MemoryReader:
    def __init__(self, store: MemoryStore, plan: ReadPlan, cache: bool = True) -> None:
        self.store = store
        self.plan = plan
        self.cache = cache
        self.layouts = [v.layout() for v in plan.views]
        self.windows = [[w.window for w in lay.windows] for lay in self.layouts]
        self.widths = [len(lay.outputs) for lay in self.layouts]
        bounds = np.cumsum([0, *self.widths])
        self.defaults = [plan.defaults[bounds[j]:bounds[j + 1]] for j in range(len(self.widths))]

    def read(self, ids: EntityIds, now: int | None = None, dtype: type = np.float32
             ) -> tuple[np.ndarray, np.ndarray]:
        feats, missing, _ = self._read(ids, now, dtype, False)
        return feats, missing

    def read_timed(self, ids: EntityIds, now: int | None = None, dtype: type = np.float32
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`read` and, per row and view, the newest event time (epoch ms, NaN: none) of
        the tiles the read merged — the same value the Redis store's read returns."""
        feats, missing, newest = self._read(ids, now, dtype, True)
        assert newest is not None
        return feats, missing, newest

    def _read(self, ids: EntityIds, now: int | None, dtype: type, timed: bool
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        now = now_ms() if now is None else now
        n, keys = self.plan.keys(ids)
        nv = len(self.layouts)
        # the current tile of every window (tiles.py): the cache is valid while it is unchanged
        ats = [tuple(w.covering(now)[1] for w in ws) for ws in self.windows]
        defaults = self.defaults
        parts: list[np.ndarray] = []
        missing = np.ones(n, dtype=bool)
        newest = np.full((n, nv), np.nan) if timed else None
        data = self.store.data
        for r in range(n):
            for j in range(nv):
                state = data.get(keys[r * nv + j])
                if state is None:
                    parts.append(defaults[j])
                    continue
                missing[r] = False
                out = state.out
                if out is None or state.cache_at != ats[j] or not self.cache:
                    with self.store.lock:  # writers fold into the same merged records
                        if state.cache_at != ats[j] or not self.cache:
                            merge_windows(state, self.layouts[j], now)
                            state.cache_at = ats[j] if state.layout is not None else None
                        out = outputs(state, self.layouts[j])
                parts.append(out)
                if newest is not None:
                    newest[r, j] = newest_event(state)
        full = np.concatenate(parts).reshape(n, self.plan.width)
        with np.errstate(over="ignore"):  # beyond float32's range is ±inf, as documented
            return full[:, self.plan.take].astype(dtype), missing, newest


class MemoryStore:
    """Single-process store; writes and cache refreshes take one lock."""

    kind = "memory"

    def __init__(self) -> None:
        self.data: dict[str, KeyState] = {}
        self.lock = threading.Lock()
        self._layouts: dict[str, ViewLayout] = {}
        self._next_sweep = 0

    def reader(self, views: Sequence[FeatureView], features: Sequence[str] | None = None,
               cache: bool = True) -> MemoryReader:
        """A compiled reader; ``cache=False`` merges every tile on every read (benchmarks)."""
        self.register(views)
        return MemoryReader(self, ReadPlan(views, features), cache)

    def register(self, views: Sequence[FeatureView]) -> None:
        """Views whose keys this store may see (their layouts drive incremental caching)."""
        for v in views:
            self._layouts[f"{v.name}:{v.version}"] = v.layout()

    def add_dead_letters(self, stream: str, rejected: Sequence[Rejected]) -> None:
        """None kept: one process's store (the ingestor keeps its last dead letters)."""

    def state(self, key: str) -> KeyState:
        """The state of ``key``, made (empty) when new."""
        st = self.data.get(key)
        if st is None:
            view_version = key.rsplit(":", 2)
            layout = self._layouts.get(f"{view_version[-2]}:{view_version[-1]}")
            st = self.data[key] = KeyState(layout)
        return st

    def write(self, batch: UpdateBatch, wall_ms: int | None = None) -> None:
        """Apply a batch; ``wall_ms`` is the clock TTLs run on (the offline builder replays in
        event time and passes the batch's arrival)."""
        wall = now_ms() if wall_ms is None else wall_ms
        self.sweep(wall)
        with self.lock:
            states = []
            for key, ttl in zip(batch.keys, batch.key_ttl_ms, strict=True):
                st = self.state(key)
                st.expires = max(st.expires, wall + ttl)
                states.append(st)
            dedup = batch.key_dedup_ms
            dedup_any = any(dedup)
            decided: dict[tuple[int, int], bool] = {}
            newest: dict[int, int] = {}
            for k, gid, idx, slot, ts, arrival, sid, x, reg, rank, tag in batch.ops:
                st = states[k]
                if dedup_any and dedup[k]:  # the first op of an event at a key decides for all
                    fresh = decided.get((k, tag))
                    if fresh is None:
                        fresh = decided[(k, tag)] = st.admit_id(sid, arrival, dedup[k])
                        if fresh:
                            newest[k] = max(newest.get(k, arrival), arrival)
                    if not fresh:
                        continue  # a redelivery of an event this key already counted
                ring = st.rings.get(gid)
                if ring is None:
                    ring = st.rings[gid] = []
                if slot >= len(ring):
                    ring.extend([None] * (slot + 1 - len(ring)))
                entry = ring[slot]
                if entry is None or entry[0] < idx:
                    entry = [idx, bytearray(256) if reg >= 0 else [*EMPTY_RECORD]]
                    ring[slot] = entry
                elif entry[0] > idx:
                    continue  # the slot already holds a newer tile: this one left every window
                if reg >= 0:
                    regs = entry[1]
                    if rank > regs[reg]:
                        regs[reg] = rank
                else:
                    record_update(entry[1], x, ts, arrival, sid)
                if st.cache_at is not None:
                    self._fold(st, gid, idx, ts, arrival, sid, x, reg, rank)
            for k, top in newest.items():  # forget ids older than the window
                states[k].forget_ids(top - dedup[k])

    def sweep(self, wall_ms: int) -> None:
        """Expire entities once a minute of the write clock."""
        if wall_ms >= self._next_sweep:
            self._next_sweep = wall_ms + 60_000
            self.expire(wall_ms)

    def bulk_loader(self) -> BulkLoader:
        """A writer of a whole file replay's tiles in bulk (``online.bulk``): the same state as
        :meth:`write` batch by batch, in a fraction of the time."""
        return BulkLoader(self)

    @staticmethod
    def _fold(st: KeyState, gid: int, idx: int, ts: int, arrival: int, sid: int, x: float,
              reg: int, rank: int) -> None:
        """Add one update to the cached merged windows that cover its tile."""
        assert st.layout is not None
        for w in st.layout.windows:
            if w.gid != gid:
                continue
            lo, hi = st.ranges[w.wid]
            if lo <= idx <= hi:
                m = st.merged[w.wid]
                if reg >= 0:
                    if rank > m[reg]:
                        m[reg] = rank
                else:
                    m.update(x, ts, arrival, sid)
                st.out = None

    def expire(self, wall_ms: int | None = None) -> int:
        """Drop entities whose tiles all left their windows; returns how many."""
        wall = now_ms() if wall_ms is None else wall_ms
        with self.lock:
            dead = [k for k, st in self.data.items() if st.expires < wall]
            for k in dead:
                del self.data[k]
        return len(dead)

    def ping(self) -> None:
        return None

    def close(self) -> None:
        self.data.clear()
