"""Histogram buckets: the latency and row bounds every series uses, and counting values into
them at once with numpy (``bisect_left`` semantics, as ``prometheus_client`` counts)."""

from __future__ import annotations

from typing import Any

import numpy as np

# Conventional latency buckets (seconds), from 100 µs to 10 s; each model's objective is added.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOTAL = "total"  # the stage that spans a whole request


def latency_buckets(objectives_ms: list[float]) -> list[float]:
    """The conventional buckets plus every model's latency objective, in seconds, sorted."""
    bounds = set(LATENCY_BUCKETS_S)
    bounds.update(round(ms / 1000.0, 9) for ms in objectives_ms if ms and ms > 0)
    return sorted(bounds)


def bucket_counts(bounds: np.ndarray, values: Any, n: int) -> list[int]:
    """How many ``values`` fall in each bucket (``bisect_left`` semantics; last = +Inf)."""
    idx = np.searchsorted(bounds, np.asarray(values), side="left")
    return np.bincount(idx, minlength=n).tolist()  # type: ignore[no-any-return]
