"""Two small caches on the predict path; both off by default, both counted, both versioned.

* :class:`PredictionCache` — model outputs keyed by (model name, version, the exact bytes of the
  assembled input row). Same features in, same answer out: an exact-match cache can never serve a
  wrong answer, only a stale-by-age one, which ``ttl_s`` bounds.
* :class:`FeatureNearCache` — online feature rows read from the store, kept in process for at most
  ``max_staleness_ms``, so a hot entity costs no round trip; when the store is down a row up to
  ``fallback_staleness_ms`` old still beats the declared defaults (the response is flagged).

Both are LRU-bounded in entries. Both drop a model's entries when the version being served for
that model name changes (:meth:`observe_version`), so a new version never sees an old answer.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import numpy as np


class _Lru:
    """Bounded LRU of (stored_at, value) with hit/miss counters."""

    __slots__ = ("entries", "capacity", "hits", "misses", "evictions", "_versions")

    def __init__(self, capacity: int) -> None:
        self.entries: OrderedDict[Any, tuple[float, Any]] = OrderedDict()
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._versions: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def _get(self, key: Any, max_age_s: float, now: float) -> tuple[float, Any] | None:
        item = self.entries.get(key)
        if item is None or now - item[0] > max_age_s:
            return None
        self.entries.move_to_end(key)
        return item

    def _put(self, key: Any, value: Any, now: float) -> None:
        entries = self.entries
        entries[key] = (now, value)
        entries.move_to_end(key)
        while len(entries) > self.capacity:
            entries.popitem(last=False)
            self.evictions += 1

    def observe_version(self, name: str, version: int) -> bool:
        """Drop every entry of model ``name`` when its served version changed; True if it did."""
        old = self._versions.get(name)
        self._versions[name] = version
        if old is None or old == version:
            return False
        for key in [k for k in self.entries if k[0] == name]:
            del self.entries[key]
        return True

    def clear(self) -> None:
        self.entries.clear()

    def stats(self) -> dict[str, Any]:
        total = self.hits + self.misses
        return {"enabled": self.enabled, "entries": len(self.entries), "capacity": self.capacity,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "hit_ratio": round(self.hits / total, 4) if total else 0.0}


class PredictionCache(_Lru):
    """Outputs of one input row, keyed by model name, version and the row's exact bytes."""

    __slots__ = ("ttl_s",)

    def __init__(self, capacity: int = 0, ttl_s: float = 60.0) -> None:
        super().__init__(capacity)
        self.ttl_s = ttl_s

    def get(self, name: str, version: int, row: bytes) -> dict[str, np.ndarray] | None:
        item = self._get((name, version, row), self.ttl_s, time.monotonic())
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        return item[1]  # type: ignore[no-any-return]

    def put(self, name: str, version: int, row: bytes, outputs: dict[str, np.ndarray]) -> None:
        self._put((name, version, row), outputs, time.monotonic())


class FeatureNearCache(_Lru):
    """Feature rows per (model name, version, entity ids), with a staleness bound per lookup."""

    __slots__ = ("max_staleness_s", "fallback_staleness_s", "fallback_hits")

    def __init__(self, capacity: int = 0, max_staleness_ms: float = 1000.0,
                 fallback_staleness_ms: float = 30_000.0) -> None:
        super().__init__(capacity)
        self.max_staleness_s = max_staleness_ms / 1000.0
        self.fallback_staleness_s = max(fallback_staleness_ms, max_staleness_ms) / 1000.0
        self.fallback_hits = 0

    def get(self, key: tuple[Any, ...], *, fallback: bool = False
            ) -> tuple[float, np.ndarray, bool] | None:
        """(age in seconds, feature row, entity missing) if cached fresh enough, else None.

        ``fallback=True`` is the store-down case: the wider ``fallback_staleness_ms`` applies.
        """
        now = time.monotonic()
        item = self._get(key, self.fallback_staleness_s if fallback else self.max_staleness_s, now)
        if item is None:
            self.misses += 1
            return None
        if fallback:
            self.fallback_hits += 1
        else:
            self.hits += 1
        row, missing = item[1]
        return now - item[0], row, missing

    def put(self, key: tuple[Any, ...], row: np.ndarray, missing: bool) -> None:
        self._put(key, (row, missing), time.monotonic())

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["fallback_hits"] = self.fallback_hits
        out["max_staleness_ms"] = self.max_staleness_s * 1000
        out["fallback_staleness_ms"] = self.fallback_staleness_s * 1000
        return out
