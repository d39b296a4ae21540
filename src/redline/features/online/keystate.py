"""The state the memory store keeps per key, shared by its op-by-op writes and the bulk preload."""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.features.layout import ViewLayout


class KeyState:
    """One key's tiles in the memory store: a ring per tile group, the merged windows a read
    serves, and the event ids its source deduplicates."""

    __slots__ = ("rings", "layout", "cache_at", "ranges", "merged", "out", "expires", "ids")

    def __init__(self, layout: ViewLayout | None) -> None:
        self.rings: dict[int, list[Any]] = {}  # gid -> ring of [tile idx, record] or None
        self.layout = layout
        self.cache_at: tuple[int, ...] | None = None  # current tile per window, when cached
        self.ranges: list[tuple[int, int]] = []  # per window: covered tiles (lo, hi)
        self.merged: list[Any] = []  # per window: merged record / registers
        self.out: np.ndarray | None = None  # outputs of ``merged`` (None: derive again)
        self.expires = 0
        self.ids: dict[int, int] = {}  # event id -> arrival, when its source deduplicates

    def admit_id(self, sid: int, arrival: int, window: int) -> bool:
        """Whether event ``sid`` arriving at ``arrival`` is new to this key (a redelivery is the
        same id arrived at most ``window`` earlier); a new one is remembered."""
        seen = self.ids.get(sid)
        if seen is not None and arrival - seen <= window:
            return False
        self.ids[sid] = arrival
        return True

    def forget_ids(self, cutoff: int) -> None:
        """Forget the ids that arrived before ``cutoff`` (after each batch, as the Lua does)."""
        ids = self.ids
        for old in [i for i, a in ids.items() if a < cutoff]:
            del ids[old]
