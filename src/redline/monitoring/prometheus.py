"""The ``prometheus_client`` metrics, brought up to date from :class:`RequestMetrics` once a
tick by adding differences, and the scrape: one registry in a single process, or the standard
multiprocess files (``PROMETHEUS_MULTIPROC_DIR``) that any worker's ``GET /metrics`` merges."""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.monitoring.buckets import ROW_BUCKETS, TOTAL, bucket_counts

if TYPE_CHECKING:
    from redline.monitoring.metrics import RequestMetrics


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
                observe_all(self.feature_age.labels(model), ages)
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


def observe_all(child: Any, values: list[float]) -> None:
    """``child.observe(v)`` for every value, bucketed at once: ``observe`` counts a value in the
    first bucket whose upper bound is >= it, as ``searchsorted(side="left")`` does (one
    ``observe`` per value was ~1.5 µs, ~0.75 ms a tick for 500 feature ages)."""
    bounds = np.asarray(child._upper_bounds, dtype=np.float64)  # the last one is +Inf
    counts = bucket_counts(bounds, np.asarray(values, dtype=np.float64), bounds.size)
    _add_histogram(child, counts, [0] * bounds.size, math.fsum(values), 1.0)


BREAKER_LEVEL = {"closed": 0, "half_open": 1, "half-open": 1, "open": 2}

