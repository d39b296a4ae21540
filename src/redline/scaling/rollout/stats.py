"""What a rollout counts per version: requests, server errors, refusals and latency.

Latencies are kept as 5%-wide buckets on a log scale, so processes can add up their
histograms and the p99 of the sum is the p99 of every request (to within one bucket).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_STEP = math.log(1.05)  # latency histogram buckets: 5% wide


def _bucket_of(lat_us: np.ndarray) -> np.ndarray:
    return np.floor(np.log(np.maximum(lat_us, 1.0)) / _STEP).astype(np.int64)


def histogram_p99_ms(hist: dict[int, int]) -> float:
    """The p99 of a merged histogram: the upper edge of the bucket holding it."""
    total = sum(hist.values())
    if not total:
        return 0.0
    rank = math.ceil(0.99 * total)
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return math.exp((bucket + 1) * _STEP) / 1000.0
    return 0.0  # pragma: no cover - the loop always reaches the rank


def share_over(hist: dict[int, int], bound_ms: float) -> tuple[float, int]:
    """The share of a latency histogram's requests wholly beyond ``bound_ms``, and how many."""
    total = sum(hist.values())
    if not total:
        return 0.0, 0
    lowest = math.log(bound_ms * 1000.0) / _STEP  # a bucket's lower edge is exp(b * _STEP) µs
    over = sum(c for b, c in hist.items() if b >= lowest)
    return over / total, total


class VersionStats:
    """Requests, server errors and recent latencies of one model version in this process, and
    the requests it refused as the client's mistakes (by code, beside ``requests``)."""

    def __init__(self, window: int = 4096) -> None:
        self.requests = 0
        self.errors = 0
        self.refused: dict[str, int] = {}
        self._lat_us: list[float] = []
        self._window = window

    def refuse(self, code: str) -> None:
        self.refused[code] = self.refused.get(code, 0) + 1

    @property
    def seen(self) -> int:
        """Every request, refused ones included."""
        return self.requests + sum(self.refused.values())

    def add(self, ok: bool, total_us: float) -> None:
        self.requests += 1
        if not ok:
            self.errors += 1
        lat = self._lat_us
        lat.append(total_us)
        if len(lat) > 2 * self._window:
            del lat[: len(lat) - self._window]

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def p99_ms(self) -> float:
        if not self._lat_us:
            return 0.0
        return float(np.percentile(self._lat_us[-self._window:], 99)) / 1000.0

    def histogram(self) -> dict[int, int]:
        """The recent latencies as 5%-wide buckets: what other processes merge."""
        if not self._lat_us:
            return {}
        buckets, counts = np.unique(_bucket_of(np.asarray(self._lat_us[-self._window:])),
                                    return_counts=True)
        return {int(b): int(c) for b, c in zip(buckets, counts, strict=True)}

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors,
                "error_rate": round(self.error_rate, 4), "p99_ms": round(self.p99_ms(), 3),
                "hist": {str(b): c for b, c in self.histogram().items()},
                "refused": dict(self.refused)}


class MergedStats:
    """One version's counts summed over processes, with the same face as :class:`VersionStats`
    (what the verdict reads)."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.processes = 0
        self.hist: dict[int, int] = {}
        self.refused: dict[str, int] = {}

    def add(self, requests: int, errors: int, hist: dict[int, int],
            refused: dict[str, int] | None = None) -> None:
        """One more process's counts."""
        self.requests += requests
        self.errors += errors
        self.processes += 1
        for bucket, count in hist.items():
            self.hist[bucket] = self.hist.get(bucket, 0) + count
        for code, count in (refused or {}).items():
            self.refused[code] = self.refused.get(code, 0) + int(count)

    def merge(self, other: MergedStats) -> None:
        """Another sum's counts, its processes included."""
        self.requests += other.requests
        self.errors += other.errors
        self.processes += other.processes
        for bucket, count in other.hist.items():
            self.hist[bucket] = self.hist.get(bucket, 0) + count
        for code, count in other.refused.items():
            self.refused[code] = self.refused.get(code, 0) + count

    @property
    def seen(self) -> int:
        return self.requests + sum(self.refused.values())

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def p99_ms(self) -> float:
        return histogram_p99_ms(self.hist)


class ShadowStats:
    """A shadow's copies: sent, dropped, compared with the baseline's answer, mismatched."""

    def __init__(self) -> None:
        self.sent = 0
        self.dropped = 0
        self.compared = 0
        self.mismatched = 0
        self.errors = 0
        self.max_abs_diff = 0.0
        self.candidate = VersionStats()

    def as_dict(self) -> dict[str, Any]:
        return {"sent": self.sent, "dropped": self.dropped, "compared": self.compared,
                "mismatched": self.mismatched, "errors": self.errors,
                "max_abs_diff": self.max_abs_diff,
                "candidate_p99_ms": round(self.candidate.p99_ms(), 3)}
