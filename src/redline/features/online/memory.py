"""The embedded online store: tile rings in Python dicts, one process, no services.

Reads of an entity whose tiles did not change since the last read (no write, same current tiles)
come from a per-entity result cache; any write or tile boundary invalidates it, so a cached
answer is always the one a fresh merge would give.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from redline.features.aggregates import (
    EMPTY_RECORD,
    hll_estimate,
    record_merge,
    record_update,
    record_value,
)
from redline.features.definitions import FeatureView, ViewLayout
from redline.features.events import UpdateBatch
from redline.features.online.base import EntityIds, ReadPlan, now_ms


class _KeyState:
    __slots__ = ("slots", "version", "cache_at", "cache", "expires")

    def __init__(self) -> None:
        self.slots: dict[tuple[int, int], list[Any]] = {}  # (gid, slot) -> [tile idx, record]
        self.version = 0
        self.cache_at: tuple[int, ...] | None = None
        self.cache: np.ndarray | None = None
        self.expires = 0


def compute_view(state: _KeyState, layout: ViewLayout, now: int) -> np.ndarray:
    """Merge the tiles covering ``now`` for each window and derive the view's outputs."""
    merged: list[Any] = []
    for w in layout.windows:
        g = layout.groups[w.gid]
        lo, hi = w.window.covering(now)
        if g.hll:
            regs = bytearray(256)
            for slot in range(g.ring):
                entry = state.slots.get((g.gid, slot))
                if entry is not None and lo <= entry[0] <= hi:
                    for i, r in enumerate(entry[1]):
                        if r > regs[i]:
                            regs[i] = r
            merged.append(regs)
        else:
            acc = list(EMPTY_RECORD)
            for slot in range(g.ring):
                entry = state.slots.get((g.gid, slot))
                if entry is not None and lo <= entry[0] <= hi:
                    record_merge(acc, entry[1])
            merged.append(acc)
    out = np.empty(len(layout.outputs), dtype=np.float64)
    for i, o in enumerate(layout.outputs):
        m = merged[o.wid]
        if o.kind == "distinct":
            out[i] = hll_estimate(m, len(m)) if any(m) else 0.0
        else:
            out[i] = record_value(m, o.kind, o.default)
    return out


class MemoryReader:
    def __init__(self, store: MemoryStore, plan: ReadPlan) -> None:
        self.store = store
        self.plan = plan
        self.layouts = [v.layout() for v in plan.views]
        self.tiles = [sorted({g.tile_ms for g in lay.groups}) for lay in self.layouts]
        self.widths = [len(lay.outputs) for lay in self.layouts]

    def read(self, ids: EntityIds, now: int | None = None, dtype: type = np.float32
             ) -> tuple[np.ndarray, np.ndarray]:
        now = now_ms() if now is None else now
        n, keys = self.plan.keys(ids)
        nv = len(self.layouts)
        full = np.empty((n, self.plan.width), dtype=np.float64)
        missing = np.ones(n, dtype=bool)
        data = self.store.data
        for r in range(n):
            col = 0
            for j in range(nv):
                w = self.widths[j]
                state = data.get(keys[r * nv + j])
                if state is None:
                    full[r, col:col + w] = self.plan.defaults[col:col + w]
                else:
                    missing[r] = False
                    at = tuple(now // t for t in self.tiles[j])
                    if state.cache_at != at or state.cache is None:
                        state.cache = compute_view(state, self.layouts[j], now)
                        state.cache_at = at
                    full[r, col:col + w] = state.cache
                col += w
        return full[:, self.plan.take].astype(dtype), missing


class MemoryStore:
    """Single-process store; writes take a lock, reads see whole batches (GIL + swap)."""

    kind = "memory"

    def __init__(self) -> None:
        self.data: dict[str, _KeyState] = {}
        self._lock = threading.Lock()
        self._layouts: dict[str, ViewLayout] = {}
        self._next_sweep = 0

    def reader(self, views: Sequence[FeatureView], features: Sequence[str] | None = None
               ) -> MemoryReader:
        return MemoryReader(self, ReadPlan(views, features))

    def register(self, views: Sequence[FeatureView]) -> None:
        """Views whose groups writes need (HLL vs numeric is in the op itself)."""
        for v in views:
            self._layouts[f"{v.name}:{v.version}"] = v.layout()

    def write(self, batch: UpdateBatch, wall_ms: int | None = None) -> None:
        wall = now_ms() if wall_ms is None else wall_ms
        if wall >= self._next_sweep:
            self._next_sweep = wall + 60_000
            self.expire(wall)
        with self._lock:
            states = []
            for key, ttl in zip(batch.keys, batch.key_ttl_ms, strict=True):
                st = self.data.get(key)
                if st is None:
                    st = self.data[key] = _KeyState()
                st.version += 1
                st.cache = None
                st.expires = max(st.expires, wall + ttl)
                states.append(st)
            for k, gid, idx, slot, ts, x, reg, rank, _tag in batch.ops:
                slots = states[k].slots
                entry = slots.get((gid, slot))
                if entry is None or entry[0] < idx:
                    entry = [idx, bytearray(256) if reg >= 0 else list(EMPTY_RECORD)]
                    slots[(gid, slot)] = entry
                elif entry[0] > idx:
                    continue  # the slot already holds a newer tile: this one left every window
                if reg >= 0:
                    regs = entry[1]
                    if rank > regs[reg]:
                        regs[reg] = rank
                else:
                    record_update(entry[1], x, ts)

    def expire(self, wall_ms: int | None = None) -> int:
        """Drop entities whose tiles all left their windows; returns how many."""
        wall = now_ms() if wall_ms is None else wall_ms
        with self._lock:
            dead = [k for k, st in self.data.items() if st.expires < wall]
            for k in dead:
                del self.data[k]
        return len(dead)

    def ping(self) -> None:
        return None

    def close(self) -> None:
        self.data.clear()
