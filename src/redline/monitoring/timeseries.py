"""The per-second time series ``redline top`` and the dashboard draw (rate, errors and stage
percentiles per series), and the last minute's share of requests over their latency objective.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from typing import Any

from redline.monitoring.buckets import TOTAL
from redline.monitoring.metrics import RequestMetrics

HISTORY_TICKS = 300  # five minutes at one tick a second
OBJECTIVE_SHARE = 0.99  # the latency objective: 99% of requests within slo_ms


class TimeSeries:
    """The points of the last ``HISTORY_TICKS`` ticks, made from what :class:`RequestMetrics`
    counted since the tick before; ``slo_ms(model)`` is a model's latency objective."""

    def __init__(self, metrics: RequestMetrics, buckets_s: list[float],
                 slo_ms: Callable[[str], float]) -> None:
        self.metrics = metrics
        self.buckets_s = buckets_s
        self.slo_ms = slo_ms
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_TICKS)
        self._objective_window: dict[str, deque[tuple[int, int]]] = {}
        self._last_counts: dict[tuple[str, str, str], list[int]] = {}
        self._last_requests: dict[tuple[str, str, str], dict[tuple[str, str, str], int]] = {}

    def point(self, dt: float, tick: dict[tuple[str, str, str], dict[str, Any]]
              ) -> dict[str, Any]:
        """One second of the time series: rate, errors and p50/p95/p99 per stage, per series
        (``tick``: ``RequestMetrics.take_tick``'s). The caller appends it to :attr:`history`
        once the tick has added the rest (the drift verdicts)."""
        point: dict[str, Any] = {"t": round(time.time(), 3), "dt": round(dt, 3), "series": {}}
        for key, series in self.metrics.series.items():
            api, model, version = key
            last = self._last_requests.setdefault(key, {})
            n = errors = 0
            paths: dict[str, int] = {}
            for rkey, count in series.requests.items():
                d = count - last.get(rkey, 0)
                if d:
                    n += d
                    if rkey[2] != "ok":
                        errors += d
                    paths[rkey[1]] = paths.get(rkey[1], 0) + d
                last[rkey] = count
            total = series.timings.get(TOTAL)
            if total is not None:
                self._track_objective(key, total.counts)
            stages = tick.get(key, {})
            if not n and not stages:
                continue
            point["series"][f"{api}:{model}:{version}"] = {
                "api": api, "model": model, "version": version,
                "rate": round(n / dt, 1), "errors": errors, "paths": paths, "stages": stages,
            }
        return point

    def _track_objective(self, key: tuple[str, str, str], counts: list[int]) -> None:
        """Requests and requests over the objective, per tick, for the last minute."""
        slo_s = float(self.slo_ms(key[1])) / 1000.0
        idx = bisect_left(self.buckets_s, round(slo_s, 9))
        total, within = sum(counts), sum(counts[: idx + 1])
        last = self._last_counts.get(key)
        self._last_counts[key] = [total, within]
        if last is None:
            last = [0, 0]
        window = self._objective_window.setdefault(key[1], deque(maxlen=60))
        window.append((total - last[0], (total - within) - (last[0] - last[1])))

    def over_objective(self) -> dict[str, dict[str, Any]]:
        """Per model whose last minute had more than 1 - ``OBJECTIVE_SHARE`` of at least 100
        requests over its objective, the alert condition."""
        out: dict[str, dict[str, Any]] = {}
        for model, window in self._objective_window.items():
            n = sum(a for a, _ in window)
            over = sum(b for _, b in window)
            if n >= 100 and over / n > 1 - OBJECTIVE_SHARE:
                out[f"latency:{model}"] = {"kind": "latency", "model": model,
                                           "slo_ms": self.slo_ms(model),
                                           "requests": n, "over_objective": over,
                                           "share_over": round(over / n, 4)}
        return out
