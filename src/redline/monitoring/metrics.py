"""Prometheus metrics from finished request records, folded in batches off the request path.

The fast path is written once, deliberately: ``prometheus_client``'s ``Histogram.observe`` costs
about 2.4 µs (3.4 µs in multiprocess mode) on this class of machine, and a request has up to
eight timings, which would add ~20 µs to a request that costs ~60 µs. So the request path only
appends the finished record to a list (``ServerMonitor``'s feed: one C-level ``list.append``);
the tick folds the records in batches: each timing is appended to a plain list per series and
stage (:meth:`RequestMetrics.fold`), and the lists are bucketed with one numpy ``searchsorted``
per stage when the metrics are read (:meth:`RequestMetrics.settle`). Once a second
:class:`PrometheusExport` adds the *differences* to ordinary ``prometheus_client`` metrics. Those
then behave as usual: one registry in a single process, or the standard multiprocess files
(``PROMETHEUS_MULTIPROC_DIR``) that any worker's ``GET /metrics`` merges.

Besides the Prometheus buckets each timing is kept, bounded, for one tick, so ``redline top`` and
the dashboard can show exact p50/p95/p99 per stage for every second.
"""


from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.monitoring.buckets import (
    LATENCY_BUCKETS_S,
    ROW_BUCKETS,
    TOTAL,
    bucket_counts,
    latency_buckets,
)

# The names this module held before the slow log and the export moved out, for code that
# imports them from here.
from redline.monitoring.prometheus import (
    BREAKER_LEVEL,
    PrometheusExport,
    multiprocess_dir,
    worker_exited,
)
from redline.monitoring.slowlog import SlowLog, describe
from redline.monitoring.stage_times import PATHS, V1_STAGES

if TYPE_CHECKING:
    from redline.serving.stages import RequestRecord

__all__ = [
    "BREAKER_LEVEL", "LATENCY_BUCKETS_S", "PERCENTILES", "ROW_BUCKETS", "TOTAL",
    "PrometheusExport", "RequestMetrics", "SlowLog", "describe", "latency_buckets",
    "multiprocess_dir", "percentiles", "worker_exited",
]

# The stages of a flat stage-times row (start, decoded, inferred, end, rows): name, from, to.
_FLAT_STAGES = (("decode", 0, 1), ("inference", 1, 2), ("encode", 2, 3), ("total", 0, 3))
PERCENTILES = (50, 95, 99)


class _Timing:
    """One histogram: counts per bucket (last = +Inf), the sum, this tick's raw values, and
    the values folded since the last :meth:`RequestMetrics.settle` (``pending``, appended to
    through its bound ``append``: the list is emptied in place, never replaced)."""

    __slots__ = ("counts", "sum_ns", "recent", "recent_n", "pending", "pending_arrays",
                 "append", "flushed", "flushed_sum")

    def __init__(self, n_bounds: int) -> None:
        self.counts = [0] * (n_bounds + 1)
        self.sum_ns = 0
        self.recent: list[np.ndarray] = []
        self.recent_n = 0
        self.pending: list[int] = []
        self.pending_arrays: list[np.ndarray] = []  # folded from flat stage times
        self.append = self.pending.append
        self.flushed = [0] * (n_bounds + 1)
        self.flushed_sum = 0


class _Series:
    """Everything recorded for one (api, model, version)."""

    __slots__ = ("timings", "appends", "total", "requests", "rows", "rows_flushed",
                 "rows_pending", "rows_arrays", "feature_age")

    def __init__(self) -> None:
        self.timings: dict[str, _Timing] = {}
        # stage -> its pending list's bound append, and the total's: the fold's only lookups
        self.appends: dict[str, Callable[[int], None]] = {}
        self.total: Callable[[int], None] | None = None
        self.requests: dict[tuple[str, str, str], int] = {}  # (transport, path, status) -> n
        self.rows = [0] * (len(ROW_BUCKETS) + 1)
        self.rows_flushed = [0] * (len(ROW_BUCKETS) + 1)
        self.rows_pending: list[int] = []
        self.rows_arrays: list[np.ndarray] = []  # folded from flat stage times
        self.feature_age: list[float] = []  # seconds, this tick

    def timing(self, stage: str, n_bounds: int) -> Callable[[int], None]:
        """The bound append of ``stage``'s pending list, made at the stage's first value."""
        t = self.timings[stage] = _Timing(n_bounds)
        if stage == TOTAL:
            self.total = t.append
        else:
            self.appends[stage] = t.append
        return t.append


class RequestMetrics:
    """Per-series counters and histograms, folded from finished records in batches."""

    def __init__(self, buckets_s: list[float], recent_cap: int = 20_000) -> None:
        self.buckets_s = list(buckets_s)
        self._bounds_ns = [int(round(b * 1e9)) for b in self.buckets_s]
        self._bounds = np.asarray(self._bounds_ns, dtype=np.int64)
        self._rows_bounds = np.asarray(ROW_BUCKETS, dtype=np.int64)
        self._recent_cap = recent_cap
        self.series: dict[tuple[str, str, str], _Series] = {}
        self.requests_flushed: dict[tuple[str, ...], int] = {}

    def request_finished(self, record: RequestRecord) -> None:
        """One record (tests, embedding); the server folds its records in batches."""
        self.fold((record,))

    def fold(self, records: Iterable[RequestRecord]) -> None:
        """Append each record's timings to its series' pending lists (plain appends only:
        one dict lookup per series and per stage, then a bound ``list.append``)."""
        series_map = self.series
        n_bounds = len(self._bounds_ns)
        cap = self._recent_cap
        for record in records:
            key = (record.api, record.model, record.version)
            series = series_map.get(key)
            if series is None:
                series = series_map[key] = _Series()
            appends = series.appends
            spans = record.spans
            if record.api == "v1":  # features is passed twice (read, transforms): one value
                spans = _summed(spans)
            for stage, start, end in spans:
                append = appends.get(stage)
                if append is None:
                    append = series.timing(stage, n_bounds)
                append(end - start)
            total = series.total
            if total is None:
                total = series.timing(TOTAL, n_bounds)
            start = record.start_ns
            total((record.end_ns or start) - start)
            rkey = (record.transport, record.path, record.status)
            requests = series.requests
            requests[rkey] = requests.get(rkey, 0) + 1
            if record.rows:
                series.rows_pending.append(record.rows)
            attrs = record.attributes
            if attrs:
                age = attrs.get("feature_age_s")
                if age is not None and len(series.feature_age) < cap:
                    series.feature_age.append(age)

    def fold_times(self, api: str, transport: str, model: str, version: str,
                   times: np.ndarray, steps: tuple[str, ...] = ()) -> None:
        """Common requests' flat stage times into their series, as ``fold`` does records.

        ``times``: one row a request, ``start, decoded, inferred, end, rows`` (``perf_ns``;
        ``serving/stages.py``'s ``StageTimes``): decode, inference, encode and the total, a
        request answered ok on the primary path; a graph's rows then the ns in each of its
        ``steps`` (-1: not run)."""
        key = (api, model, version)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = _Series()
        n_bounds = len(self._bounds_ns)
        for stage, begin, end in _FLAT_STAGES:
            if stage not in series.timings:
                series.timing(stage, n_bounds)
            series.timings[stage].pending_arrays.append(times[:, end] - times[:, begin])
        self._fold_columns(series, times, steps)
        rkey = (transport, "primary", "ok")
        series.requests[rkey] = series.requests.get(rkey, 0) + len(times)
        series.rows_arrays.append(times[:, 4])

    def fold_v1_times(self, transport: str, model: str, version: str,
                      times: np.ndarray) -> None:
        """Common ``/v1`` requests' flat rows into their series, as ``fold`` does records.

        ``times``: one row a request, ``start, end, rows, path, feature age (ns, -1: none)``
        then the ns spent in each stage (-1: not passed; ``stage_times.V1_STAGES``)."""
        key = ("v1", model, version)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = _Series()
        n_bounds = len(self._bounds_ns)
        self._fold_columns(series, times, V1_STAGES)
        if TOTAL not in series.timings:
            series.timing(TOTAL, n_bounds)
        series.timings[TOTAL].pending_arrays.append(times[:, 1] - times[:, 0])
        requests = series.requests
        for path, n in zip(PATHS, np.bincount(times[:, 3], minlength=len(PATHS)).tolist(),
                           strict=False):
            if n:
                rkey = (transport, path, "ok")
                requests[rkey] = requests.get(rkey, 0) + n
        rows = times[:, 2]
        series.rows_arrays.append(rows[rows > 0])
        ages = times[:, 4]
        ages = ages[ages >= 0]
        room = self._recent_cap - len(series.feature_age)
        if ages.size and room > 0:
            series.feature_age.extend((ages[:room] / 1e9).tolist())

    def _fold_columns(self, series: _Series, times: np.ndarray,
                      stages: tuple[str, ...]) -> None:
        """Columns 5, 6, ... of flat rows: the ns each request spent in ``stages`` (-1: not
        passed), into those stages' timings."""
        for j, stage in enumerate(stages, start=5):
            spent = times[:, j]
            spent = spent[spent >= 0]
            if spent.size:
                if stage not in series.timings:
                    series.timing(stage, len(self._bounds_ns))
                series.timings[stage].pending_arrays.append(spent)

    def settle(self) -> None:
        """Bucket what was folded since the last call: one ``searchsorted`` per stage."""
        for _ in self.settle_steps():
            pass

    def settle_steps(self) -> Iterator[None]:
        """``settle``, one stage at a time: the tick lets the loop serve between steps."""
        bounds, n = self._bounds, len(self._bounds_ns) + 1
        cap = self._recent_cap
        for series in list(self.series.values()):
            for t in list(series.timings.values()):
                if not t.pending and not t.pending_arrays:
                    continue
                parts = t.pending_arrays
                t.pending_arrays = []
                if t.pending:
                    parts.append(np.asarray(t.pending, dtype=np.int64))
                    t.pending.clear()  # in place (same step): the fold holds its bound append
                values = parts[0] if len(parts) == 1 else np.concatenate(parts)
                for i, c in enumerate(bucket_counts(bounds, values, n)):
                    if c:
                        t.counts[i] += c
                t.sum_ns += int(values.sum())
                if t.recent_n < cap:
                    t.recent.append(values[: cap - t.recent_n])
                    t.recent_n += min(values.size, cap - t.recent_n)
                yield
            if series.rows_pending or series.rows_arrays:
                row_parts = series.rows_arrays
                series.rows_arrays = []
                if series.rows_pending:
                    row_parts.append(np.asarray(series.rows_pending, dtype=np.int64))
                    series.rows_pending = []
                rows = row_parts[0] if len(row_parts) == 1 else np.concatenate(row_parts)
                counts = bucket_counts(self._rows_bounds, rows, len(ROW_BUCKETS) + 1)
                for i, c in enumerate(counts):
                    if c:
                        series.rows[i] += c

    def take_tick(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        """This tick's count and exact p50/p95/p99 (µs) per stage, per series; clears the tick."""
        out: dict[tuple[str, str, str], dict[str, Any]] = {}
        for _ in self.take_tick_steps(out):
            pass
        return out

    def take_tick_steps(self, out: dict[tuple[str, str, str], dict[str, Any]]
                        ) -> Iterator[None]:
        """``take_tick`` into ``out``, a stage at a time (the settle first, in its steps)."""
        yield from self.settle_steps()
        for key, series in list(self.series.items()):
            stages: dict[str, dict[str, float]] = {}
            for stage, t in list(series.timings.items()):
                if not t.recent:
                    continue
                recent, t.recent, t.recent_n = t.recent, [], 0
                values = recent[0] if len(recent) == 1 else np.concatenate(recent)
                p50, p95, p99 = percentiles(values)
                stages[stage] = {"n": int(values.size), "p50": round(p50 / 1000.0, 1),
                                 "p95": round(p95 / 1000.0, 1), "p99": round(p99 / 1000.0, 1)}
                yield
            if stages:
                out[key] = stages


def percentiles(values: np.ndarray) -> tuple[float, ...]:
    """``PERCENTILES`` of ``values``, exactly as ``np.percentile`` (its default, linear) gives
    them: one sort and three interpolations. ``np.percentile`` itself spent most of the tick's
    percentile work in its own Python (``benchmarks/observability/inline_cost.py --tick``)."""
    ordered = np.sort(values)
    last = ordered.size - 1
    out = []
    for q in PERCENTILES:
        at = q / 100 * last
        lo = int(at)
        t = at - lo
        a = float(ordered[lo])
        b = float(ordered[min(lo + 1, last)])
        # numpy's lerp: from the nearer end, so an end point is met exactly
        out.append(a + (b - a) * t if t < 0.5 else b - (b - a) * (1 - t))
    return tuple(out)



def _summed(spans: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Spans with a stage passed twice made one (its durations summed), as ``timings_us``
    and the flat ``/v1`` rows count it: one observation a request and stage."""
    out: dict[str, int] = {}
    for stage, start, end in spans:
        out[stage] = out.get(stage, 0) + end - start
    return [(stage, 0, spent) for stage, spent in out.items()]

