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

import heapq
import math
import os
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.monitoring.stage_times import PATHS, V1_STAGES

if TYPE_CHECKING:
    from redline.monitoring.stage_times import FlatRecord
    from redline.serving.stages import RequestRecord

# The stages of a flat stage-times row (start, decoded, inferred, end, rows): name, from, to.
_FLAT_STAGES = (("decode", 0, 1), ("inference", 1, 2), ("encode", 2, 3), ("total", 0, 3))
# Conventional latency buckets (seconds), from 100 µs to 10 s; each model's objective is added.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOTAL = "total"
PERCENTILES = (50, 95, 99)


def latency_buckets(objectives_ms: list[float]) -> list[float]:
    """The conventional buckets plus every model's latency objective, in seconds, sorted."""
    bounds = set(LATENCY_BUCKETS_S)
    bounds.update(round(ms / 1000.0, 9) for ms in objectives_ms if ms and ms > 0)
    return sorted(bounds)


def _bucket_counts(bounds: np.ndarray, values: Any, n: int) -> list[int]:
    """How many ``values`` fall in each bucket (``bisect_left`` semantics; last = +Inf)."""
    idx = np.searchsorted(bounds, np.asarray(values), side="left")
    return np.bincount(idx, minlength=n).tolist()  # type: ignore[no-any-return]


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
                   times: np.ndarray) -> None:
        """Common requests' flat stage times into their series, as ``fold`` does records.

        ``times``: one row a request, ``start, decoded, inferred, end, rows`` (``perf_ns``;
        ``serving/stages.py``'s ``StageTimes``): decode, inference, encode and the total, a
        request answered ok on the primary path."""
        key = (api, model, version)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = _Series()
        n_bounds = len(self._bounds_ns)
        for stage, begin, end in _FLAT_STAGES:
            if stage not in series.timings:
                series.timing(stage, n_bounds)
            series.timings[stage].pending_arrays.append(times[:, end] - times[:, begin])
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
        for j, stage in enumerate(V1_STAGES, start=5):
            spent = times[:, j]
            spent = spent[spent >= 0]
            if spent.size:
                if stage not in series.timings:
                    series.timing(stage, n_bounds)
                series.timings[stage].pending_arrays.append(spent)
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
                for i, c in enumerate(_bucket_counts(bounds, values, n)):
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
                counts = _bucket_counts(self._rows_bounds, rows, len(ROW_BUCKETS) + 1)
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


class SlowLog:
    """The N slowest requests of the last minute, with their stage timings.

    Six ten-second slots, each holding at most N records; a record costs one comparison unless
    it is slower than its slot's fastest kept record.
    """

    def __init__(self, size: int = 20, window_s: float = 60.0, slots: int = 6) -> None:
        self.size = max(1, size)
        self.window_s = window_s
        self.slot_s = window_s / slots
        self._slots: deque[tuple[int, list[tuple[int, int, RequestRecord | FlatRecord]]]] = deque(
            maxlen=slots + 1)
        self._floor = 0  # the fastest kept duration of the current slot once it is full
        self._seq = 0  # ties in duration keep arrival order (records do not compare)

    def request_finished(self, record: RequestRecord) -> None:
        self.fold((record,))

    def _current(self) -> list[tuple[int, int, RequestRecord | FlatRecord]]:
        """The slot of now (a new one, with no floor, when time has moved on), its records."""
        slot = int(time.monotonic() / self.slot_s)
        if not self._slots or self._slots[-1][0] != slot:
            self._slots.append((slot, []))
            self._floor = 0
        return self._slots[-1][1]

    def fold(self, records: Iterable[RequestRecord | FlatRecord]) -> None:
        kept = self._current()
        floor, seq = self._floor, self._seq
        for record in records:
            d = (record.end_ns or record.start_ns) - record.start_ns
            if d > floor:
                seq += 1
                kept.append((d, -seq, record))
                if len(kept) > 2 * self.size:
                    kept[:] = heapq.nlargest(self.size, kept, key=_first_two)
                    floor = kept[-1][0]
        if len(kept) > self.size:
            kept[:] = heapq.nlargest(self.size, kept, key=_first_two)
            floor = kept[-1][0]
        self._floor, self._seq = floor, seq

    def fold_times(self, times: np.ndarray, totals: np.ndarray,
                   make_record: Callable[[list[int]], Any]) -> None:
        """Flat stage times (``RequestMetrics.fold_times``'s rows, ``totals`` their requests'
        ns): only the requests slower than the current slot's fastest kept one become records
        (``make_record(row)``), at most ``size`` of them."""
        self._current()  # the floor below is the slot of now's
        over = np.flatnonzero(totals > self._floor)
        if over.size > self.size:
            over = over[np.argpartition(totals[over], -self.size)[-self.size:]]
        if over.size:
            self.fold([make_record(times[i].tolist()) for i in sorted(over.tolist())])

    def slowest(self) -> list[dict[str, Any]]:
        oldest = int((time.monotonic() - self.window_s) / self.slot_s)
        items = [item for slot, kept in self._slots if slot > oldest for item in kept]
        items = heapq.nlargest(self.size, items, key=_first_two)
        return [describe(r) for _, _, r in items]


def _summed(spans: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Spans with a stage passed twice made one (its durations summed), as ``timings_us``
    and the flat ``/v1`` rows count it: one observation a request and stage."""
    out: dict[str, int] = {}
    for stage, start, end in spans:
        out[stage] = out.get(stage, 0) + end - start
    return [(stage, 0, spent) for stage, spent in out.items()]


def _first_two(item: tuple[int, int, Any]) -> tuple[int, int]:
    return item[0], item[1]


def describe(record: RequestRecord | FlatRecord) -> dict[str, Any]:
    """A record as JSON: who, when, how long, and each stage's microseconds."""
    return {
        "api": record.api, "transport": record.transport, "model": record.model,
        "version": record.version, "path": record.path, "status": record.status,
        "request_id": record.request_id, "rows": record.rows,
        "time": round(record.wall_ns / 1e9, 3), "total_us": round(record.total_us, 1),
        "stages_us": {k: v for k, v in record.timings_us().items() if k != "total"},
        "traceparent": record.traceparent,
    }


def multiprocess_dir() -> str | None:
    """The prometheus-client multiprocess directory, when several workers share one scrape."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def worker_exited(pid: int) -> None:
    """Tell the multiprocess files a worker is gone: its live gauges leave the scrape (its
    counters stay). The worker supervisor calls this when it reaps a worker."""
    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


class PrometheusExport:
    """The ``prometheus_client`` metrics, brought up to date from :class:`RequestMetrics` each tick.

    Names follow the Prometheus conventions: ``_total`` counters, ``_seconds`` histograms, base
    units, and labels for model, version, API, transport, path and status.
    """

    def __init__(self, buckets_s: list[float],
                 objective_s: Callable[[str], float] | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.buckets_s = list(buckets_s)
        self.objective_s = objective_s or (lambda model: 0.1)
        self._over_flushed: dict[tuple[str, str, str], int] = {}

        self.multiprocess = multiprocess_dir() is not None
        # In multiprocess mode the metrics write to per-process files and the scrape reads the
        # files; a private registry keeps them out of the default one either way.
        self.registry = CollectorRegistry()
        reg = self.registry
        base = ["api", "model", "version"]
        self.requests = Counter(
            "redline_requests", "Requests finished, by API, transport, model, version, serving "
            "path (primary|fallback|cache|default) and status (ok or the error code).",
            [*base, "transport", "path", "status"], registry=reg)
        self.duration = Histogram(
            "redline_request_duration_seconds", "Whole-request latency, arrival to response.",
            base, buckets=buckets_s, registry=reg)
        self.stage = Histogram(
            "redline_stage_duration_seconds", "Latency of one stage of a request (decode, "
            "admission, features, sessions, queue, inference, encode).",
            [*base, "stage"], buckets=buckets_s, registry=reg)
        self.over_objective = Counter(
            "redline_requests_over_objective", "Requests slower than their model's latency "
            "objective (slo_ms): the latency SLI's bad events, for burn-rate alerts.", base,
            registry=reg)
        self.rows = Histogram("redline_request_rows", "Rows (instances) per request.", base,
                              buckets=ROW_BUCKETS, registry=reg)
        self.feature_age = Histogram(
            "redline_feature_age_seconds", "Age of the online features a request read.",
            ["model"], buckets=(0.01, 0.1, 1, 10, 60, 300, 3600, 86400), registry=reg)
        mv = ["model", "version"]
        self.batches = Counter("redline_batches", "Model runs (batches).", mv, registry=reg)
        self.batch_rows = Counter("redline_batch_rows", "Rows run through the model, over all "
                                  "batches (rows / batches = mean batch size).", mv, registry=reg)
        self.shed = Counter("redline_shed", "Requests refused at admission, by reason "
                            "(queue_full|budget).", [*mv, "reason"], registry=reg)
        self.expired = Counter("redline_expired", "Requests dropped because their budget ran "
                               "out while queued.", mv, registry=reg)
        self.queue = Gauge("redline_queue_depth", "Requests waiting in the model's batcher.", mv,
                           registry=reg, multiprocess_mode="livesum")
        self.batch_cap = Gauge("redline_batch_size_limit", "Current batch size cap (adaptive "
                               "batching moves it).", mv, registry=reg, multiprocess_mode="livemax")
        self.model_info = Gauge("redline_model_loaded", "1 for every loaded model version.", mv,
                                registry=reg, multiprocess_mode="livemax")
        self.objective = Gauge("redline_latency_objective_seconds", "Each model's latency "
                               "objective (slo_ms).", ["model"], registry=reg,
                               multiprocess_mode="livemax")
        self.cache_hits = Counter("redline_cache_hits", "Cache hits (prediction|feature).",
                                  ["cache"], registry=reg)
        self.cache_misses = Counter("redline_cache_misses", "Cache misses.", ["cache"],
                                    registry=reg)
        self.breaker = Gauge("redline_breaker_state", "Online-store circuit breaker: 0 closed, "
                             "1 half-open, 2 open.", ["dependency"], registry=reg,
                             multiprocess_mode="livemax")
        self.breaker_opens = Counter("redline_breaker_opens", "Times the breaker opened.",
                                     ["dependency"], registry=reg)
        self.degraded = Counter("redline_degraded_requests", "/v1 requests served with "
                                "cached or default features.", registry=reg)
        self.drift_score = Gauge("redline_drift_score", "Drift statistic of a feature (or the "
                                 "prediction) over the live window vs the reference profile.",
                                 ["model", "version", "feature", "statistic"], registry=reg,
                                 multiprocess_mode="livemax")
        self.drift_alarm = Gauge("redline_drift_alarm", "1 while a feature's drift is beyond "
                                 "its calibrated threshold.", ["model", "version", "feature"],
                                 registry=reg, multiprocess_mode="livemax")
        self.quality = Gauge("redline_quality", "Rolling quality over labelled predictions "
                             "(kind=realised), its estimate before labels (kind=estimated) and "
                             "the validation score (kind=reference).",
                             ["model", "version", "metric", "kind"], registry=reg,
                             multiprocess_mode="livemax")
        self.quality_alarm = Gauge("redline_quality_alarm", "1 while realised quality is worse "
                                   "than validation beyond the tolerance.", mv, registry=reg,
                                   multiprocess_mode="livemax")
        self.labels = Counter("redline_labels", "Labels received (POST /v1/labels and review), "
                              "by outcome (joined|unmatched|late: after its prediction left "
                              "the join|duplicate: its prediction had a label already).",
                              ["outcome"], registry=reg)
        self.trace_dropped = Counter("redline_trace_spans_dropped", "Requests whose spans were "
                                     "dropped: the export queue was full, or the trace endpoint "
                                     "refused them or did not answer.", registry=reg)
        self.review_queued = Counter("redline_review_queued", "Requests sampled into the review "
                                     "queue, by reason.", ["model", "reason"], registry=reg)
        self.rollbacks = Counter("redline_rollout_rollbacks", "Rollouts this process rolled "
                                 "back, by the check that condemned the candidate (errors|"
                                 "latency|predictions|mismatch|labels).", ["model", "check"],
                                 registry=reg)
        self.entity_rows = Counter("redline_entity_rows", "/v1 rows answered from a reachable "
                                   "online store, by whether their entity was found "
                                   "(found|missing).", ["outcome"], registry=reg)
        self.entities_lost = Gauge("redline_online_store_entities_lost", "1 while the share of "
                                   "/v1 rows whose entity is missing has jumped far above its "
                                   "recent baseline (the store lost its data: a restart "
                                   "without persistence, a flush).", registry=reg,
                                   multiprocess_mode="livemax")
        self._last: dict[tuple[str, ...], float] = {}

    # ------------------------------------------------------------------ from the records
    def flush(self, metrics: RequestMetrics) -> None:
        """Add what :class:`RequestMetrics` counted since the last flush."""
        for _ in self.flush_steps(metrics):
            pass

    def flush_steps(self, metrics: RequestMetrics) -> Iterator[None]:
        """``flush``, a stage at a time (the tick lets the loop serve between steps)."""
        yield from metrics.settle_steps()
        for (api, model, version), series in list(metrics.series.items()):
            for stage, t in list(series.timings.items()):
                child = (self.duration.labels(api, model, version) if stage == TOTAL
                         else self.stage.labels(api, model, version, stage))
                _add_histogram(child, t.counts, t.flushed, t.sum_ns - t.flushed_sum, 1e-9)
                if stage == TOTAL:
                    self._flush_over(api, model, version, t.counts)
                t.flushed = list(t.counts)
                t.flushed_sum = t.sum_ns
                yield
            for (transport, path, status), n in list(series.requests.items()):
                key = (api, model, version, transport, path, status)
                done = metrics.requests_flushed.get(key, 0)
                if n > done:
                    self.requests.labels(api, model, version, transport, path, status).inc(n - done)
                    metrics.requests_flushed[key] = n
            rows = series.rows
            if rows != series.rows_flushed:
                _add_histogram(self.rows.labels(api, model, version), rows, series.rows_flushed,
                               0, 1.0)
                series.rows_flushed = list(rows)
            if series.feature_age:
                ages, series.feature_age = series.feature_age, []
                _observe_all(self.feature_age.labels(model), ages)
                yield

    def _flush_over(self, api: str, model: str, version: str, counts: list[int]) -> None:
        # The objective is a bucket boundary (latency_buckets), so this count is exact.
        idx = bisect_left(self.buckets_s, round(self.objective_s(model), 9))
        over = sum(counts[idx + 1:])
        key = (api, model, version)
        done = self._over_flushed.get(key, 0)
        if over > done:
            self.over_objective.labels(api, model, version).inc(over - done)
        elif key not in self._over_flushed:
            self.over_objective.labels(api, model, version)  # expose the zero
        self._over_flushed[key] = over

    # ------------------------------------------------------------------ sampled state
    def count_to(self, counter: Any, key: tuple[str, ...], total: float, *labels: str) -> None:
        """Bring a counter up to a running total read from elsewhere (stats dicts)."""
        last = self._last.get(key)
        child = counter.labels(*labels) if labels else counter  # exposed from zero
        if total > (last or 0.0):
            child.inc(total - (last or 0.0))
        self._last[key] = total

    def render(self) -> tuple[bytes, str]:
        """The scrape: this process's registry, or every worker's files in multiprocess mode."""
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector

        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _add_histogram(child: Any, counts: list[int], flushed: list[int], dsum: float,
                   unit: float) -> None:
    """Add bucket-count differences to a prometheus_client histogram child.

    ``_buckets`` and ``_sum`` are prometheus_client's per-child values (plain or multiprocess);
    the test suite checks the exposed text after known traffic, so a change there is caught.
    """
    for i, (now_n, was) in enumerate(zip(counts, flushed, strict=True)):
        if now_n > was:
            child._buckets[i].inc(now_n - was)
    if dsum:
        child._sum.inc(dsum * unit)


def _observe_all(child: Any, values: list[float]) -> None:
    """``child.observe(v)`` for every value, bucketed at once: ``observe`` counts a value in the
    first bucket whose upper bound is >= it, as ``searchsorted(side="left")`` does (one
    ``observe`` per value was ~1.5 µs, ~0.75 ms a tick for 500 feature ages)."""
    bounds = np.asarray(child._upper_bounds, dtype=np.float64)  # the last one is +Inf
    counts = _bucket_counts(bounds, np.asarray(values, dtype=np.float64), bounds.size)
    _add_histogram(child, counts, [0] * bounds.size, math.fsum(values), 1.0)


BREAKER_LEVEL = {"closed": 0, "half_open": 1, "half-open": 1, "open": 2}


def finite(x: float) -> float | None:
    return x if x is not None and math.isfinite(x) else None
