"""The server's monitoring: its request observers, its once-a-second tick, and its routes.

:class:`ServerMonitor` is what a server is built with (its ``monitoring``, a
``serving.server.ServerMonitoring``): ``observers()`` go into the serving ``Observers``,
``install(app)`` adds the HTTP routes, ``run()`` is the tick task.

On the request path the monitor costs, with tracing on, the keep-or-not decision that names
the response's ``traceparent``; once the response is written its one observer
(:class:`RecordFeed`) keeps the finished record and folds every 16 records into the metrics, the
slow log, the drift / quality / review windows and the trace queue. The common V2 REST request
makes no record: it leaves five integers in its version's flat list (``stage_times``), which
the tick (and any read that needs the latest) folds into the metrics and the slow log with
numpy, a thousand requests at a time; so does the common V2 gRPC request, and the common
``/v1`` request leaves its record's stage times there (eleven integers) and the record is
dropped. The
tick folds what is left (in slices, so a request waits behind at most one), then turns what
they gathered into the time series (``redline top``, ``/dashboard``), the Prometheus metrics,
the drift and quality figures and the alerts. A read that needs the latest (a scrape, the
slow log, a label) folds first.

What the tick makes lives beside this module: the time series and the latency objective in
``timeseries``, the drift and quality reports in ``reports``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from redline.monitoring.buckets import latency_buckets
from redline.monitoring.handoff import to_thread_yielding, yield_to_loop
from redline.monitoring.joinstore import join_backend
from redline.monitoring.metrics import RequestMetrics
from redline.monitoring.prometheus import PrometheusExport
from redline.monitoring.reports import VersionReports
from redline.monitoring.review import ReviewQueue
from redline.monitoring.reviewstore import review_store
from redline.monitoring.serving_gauges import (
    LoadedModels,
    PipelineCounters,
    ServedVersion,
    ServingGauges,
    loaded_versions,
)
from redline.monitoring.slowlog import SlowLog
from redline.monitoring.stage_times import (
    NEVER,
    WIDTH,
    StageTimesBuffer,
    v1_record,
    v2_record,
)
from redline.monitoring.timeseries import HISTORY_TICKS, TimeSeries
from redline.monitoring.windows import ModelWindows
from redline.serving.stages import RequestRecord

if TYPE_CHECKING:
    from redline.monitoring.tracing import SpanSink

log = logging.getLogger("redline.monitoring")

FOLD_SLICE = 250  # records folded between two chances for waiting requests (~0.25 ms of work)
TIMES_SLICE = 1000  # requests' flat stage times folded between two such chances (~0.1 ms)
FOLD_EVERY = 16  # records folded together right after a response is written (~15 µs)
DRIFT_EVERY_TICKS = 5
STEP_S = 0.0002  # the tick's steps on the loop: requests get in after about this much of them


class VersionFolders(Protocol):
    """Where a version's files are (``models.ModelRepository``): its drift thresholds are
    kept beside it."""

    def version_dir(self, name: str, version: int) -> Path: ...


class MonitoredVersion(ServedVersion, Protocol):
    """A loaded version as the monitor reads it (serving's ``ModelHandle``): the gauges' view
    and its metadata, which the drift and quality monitors are built from."""

    @property
    def metadata(self) -> Any: ...


class MonitoredModels(LoadedModels, Protocol):
    """The registry as the monitor reads it (serving's ``ModelRegistry``): the gauges' view,
    a version by name, and the repository its versions live in (None: no folder beside
    them, so drift thresholds are calibrated and not kept)."""

    @property
    def repository(self) -> VersionFolders | None: ...

    def get(self, name: str, version: str | None = None) -> MonitoredVersion: ...


class RecordFeed:
    """The monitor's one request observer: it keeps the finished record for the next fold.

    The serving code calls ``request_finished`` once the response is written, so what it does
    is never in that request's latency. It appends the record and, every ``FOLD_EVERY``
    records, folds them at once (~15 µs): folding in small batches right after a write keeps
    the work off every response and keeps each stall of the loop short (a batch of 64 took
    ~50 µs, and at concurrency 1 the next request, arriving meanwhile, paid it at p99).
    Folding a whole second's records on the tick instead held the loop for ~1 ms per slice of
    1,000 records, which the 1% of requests that arrived meanwhile paid in their p99. The tick
    folds what is left, and every read that needs the latest folds first."""

    def __init__(self, monitor: ServerMonitor) -> None:
        self.records: list[Any] = []
        self._monitor = monitor
        # (api, transport, model, version) -> the flat buffer of its common requests
        self.stage_series: dict[tuple[str, str, str, str], StageTimesBuffer] = {}

    def stage_times(self, api: str, transport: str, model: str, version: str,
                    steps: tuple[str, ...] = ()) -> StageTimesBuffer:
        """The flat stage-times buffer of a version's common requests of ``api`` ("v2", "v1")
        over ``transport`` (``serving/stages.py``'s ``StageTimes``), made at its first one;
        a graph's V2 rows carry its ``steps``' ns too (a version's steps never change)."""
        key = (api, transport, model, version)
        times = self.stage_series.get(key)
        if times is None:
            times = self.stage_series[key] = StageTimesBuffer(width=WIDTH[api], steps=steps)
            self._monitor.tune(times, model)
        return times

    def request_finished(self, record: RequestRecord) -> None:
        records = self.records
        records.append(record)
        if len(records) >= FOLD_EVERY:
            self._monitor.fold(self.take())

    def response_traceparent(self, record: RequestRecord) -> str | None:
        tracing = self._monitor.tracing
        return None if tracing is None else tracing.response_traceparent(record)  # type: ignore[no-any-return]

    def take(self, limit: int | None = None) -> list[Any]:
        """Up to ``limit`` records, oldest first (safe while the loop appends: only the
        taken prefix is removed)."""
        records = self.records
        n = len(records) if limit is None else min(limit, len(records))
        taken = records[:n]
        del records[:n]
        return taken


class ServerMonitor:
    """Metrics, slow log, traces, drift, quality, review and alerts for one server process."""

    def __init__(self, settings: Any, registry: MonitoredModels,
                 pipeline: PipelineCounters | None = None,
                 trace_exporter: SpanSink | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.pipeline = pipeline
        mon = settings.monitoring
        self.tick_s = mon.tick_s
        objectives = [settings.server.default_slo_ms] + [
            m.slo_ms for m in settings.models.values() if m.slo_ms]
        self.buckets = latency_buckets(objectives)
        self.metrics = RequestMetrics(self.buckets)
        self.feed = RecordFeed(self)
        self.slow = SlowLog(mon.slow_log_size)
        join = join_backend(settings)
        self.review = ReviewQueue(mon.review_per_minute, mon.review_capacity,
                                  review_store(join, mon.review_capacity))
        self.windows = ModelWindows(self._metadata, mon, self.review, join=join,
                                    folder=self._version_folder)
        self.export = PrometheusExport(self.buckets, self._objective_s)
        self.gauges = ServingGauges(self.export, settings, registry, pipeline)
        self.tracing: Any = None
        if trace_exporter is None:
            from redline.monitoring.tracing import span_sink

            trace_exporter = span_sink(mon)  # OTLP or Zipkin, as configured; None: off
        if trace_exporter is not None:
            self.use_trace_exporter(trace_exporter)
        self.alerts: Any = None
        if mon.alert_webhook_url:
            from redline.monitoring.alerts import AlertWebhook

            self.alerts = AlertWebhook(mon.alert_webhook_url, mon.alert_min_interval_s,
                                       mon.alert_max_interval_s)
        self.series = TimeSeries(self.metrics, self.buckets, self._slo_ms)
        self.reports = VersionReports(self.windows, self.export)
        self._last_tick = time.monotonic()
        self._ticks = 0
        self._observers_extra: list[Any] = []
        self.rollouts: Any = None  # the rollout controller whose rollbacks are counted
        self._alert_leader = True

    @property
    def history(self) -> deque[dict[str, Any]]:
        """The time series' points, oldest first (:class:`TimeSeries`)."""
        return self.series.history

    @property
    def drift_reports(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The latest drift report per (model, version) (:class:`VersionReports`)."""
        return self.reports.drift

    @property
    def quality_reports(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The latest quality report per (model, version) (:class:`VersionReports`)."""
        return self.reports.quality

    # ------------------------------------------------------------------ wiring
    def observers(self) -> list[RecordFeed]:
        """The request observers: one feed, whose records the tick folds into the rest."""
        return [self.feed]

    def fold(self, records: list[Any]) -> None:
        """Finished records into the metrics, the slow log, the windows and the trace queue."""
        self.metrics.fold(records)
        self.slow.fold(records)
        self.windows.fold(records)
        if self.tracing is not None:
            self.tracing.fold(records)

    def fold_times(self, api: str, transport: str, model: str, version: str,
                   flat: np.ndarray, steps: tuple[str, ...] = ()) -> None:
        """Common requests' flat stage times (``StageTimesBuffer.take``; a graph's rows with
        its ``steps``' ns) into the metrics and the slow log (traces and windows want none of
        them: not kept, not sampled)."""
        times = flat.reshape(-1, WIDTH[api] + len(steps))
        if api == "v2":
            self.metrics.fold_times("v2", transport, model, version, times, steps)
            self.slow.fold_times(times, times[:, 3] - times[:, 0],
                                 partial(v2_record, transport, model, version, steps=steps))
        else:
            self.metrics.fold_v1_times(transport, model, version, times)
            self.slow.fold_times(times, times[:, 1] - times[:, 0],
                                 partial(v1_record, transport, model, version))

    def drain(self) -> int:
        """Fold every record and stage time the feed holds, now (a read that needs the
        latest); returns how many requests."""
        records = self.feed.take()
        if records:
            self.fold(records)
        done = len(records)
        for (api, transport, model, version), times in list(self.feed.stage_series.items()):
            flat = times.take()
            if len(flat):
                self.fold_times(api, transport, model, version, flat, times.steps)
                done += len(flat) // times.width
            self._fold_samples(model, version, times)
        return done

    async def drain_in_slices(self) -> int:
        """Fold what the feed holds, a slice at a time, letting requests in between slices:
        records up to twice what was there at the start (a flood does not keep the tick here),
        and the flat stage times there at the start, taken at once (those that arrive
        meanwhile go to a new list, for the next fold: each is folded once, none is lost)."""
        limit = 2 * len(self.feed.records) + FOLD_SLICE
        done = 0
        while done < limit:
            records = self.feed.take(FOLD_SLICE)
            if not records:
                break
            self.fold(records)
            done += len(records)
            await asyncio.sleep(0)
        for (api, transport, model, version), times in list(self.feed.stage_series.items()):
            flat = times.take()
            step = TIMES_SLICE * times.width
            for at in range(0, len(flat), step):  # (slices of the list taken: no shifting)
                self.fold_times(api, transport, model, version, flat[at:at + step],
                                times.steps)
                await asyncio.sleep(0)
            done += len(flat) // times.width
            self._fold_samples(model, version, times)
        return done

    def _fold_samples(self, model: str, version: str, times: StageTimesBuffer) -> None:
        """The windows' sampled arrays a flat buffer holds (``/v1``) into the windows."""
        samples = times.take_samples()
        if samples:
            self.windows.fold_samples(model, version, samples)

    def use_trace_exporter(self, exporter: SpanSink) -> Any:
        """Export spans to ``exporter`` (a ``tracing.SpanSink``: ``send(bytes)`` of an OTLP
        protobuf request, e.g. ``OtlpHttpSink``); returns the tracing object. Works before or
        after the observers are wired: the feed's records reach it at the next fold, and
        responses carry a ``traceparent`` from now on."""
        from redline.monitoring.tracing import TraceExport

        mon = self.settings.monitoring
        tracing = TraceExport(exporter, mon.trace_sample_ratio, self._slow_ms,
                              mon.trace_queue_size, fed_by_monitor=True)
        self.tracing = tracing
        for (_, _, model, _), times in self.feed.stage_series.items():
            self.tune(times, model)
        return tracing

    def tune(self, times: StageTimesBuffer, model: str) -> None:
        """A flat buffer's trace settings: which requests must still get a record."""
        tracing = self.tracing
        if tracing is None:
            times.retune(NEVER, 0.0)
        else:
            times.retune(tracing.slow_ns(model), tracing.sample_ratio)

    def _slow_ms(self, model: str) -> float:
        mon = self.settings.monitoring
        if mon.trace_slow_ms is not None:
            return float(mon.trace_slow_ms)
        return float(self.settings.for_model(model).slo_ms or self.settings.server.default_slo_ms)

    def _slo_ms(self, model: str) -> float:
        slo: float = self.settings.for_model(model).slo_ms or self.settings.server.default_slo_ms
        return slo

    def _objective_s(self, model: str) -> float:
        return float(self._slo_ms(model)) / 1000.0

    def _metadata(self, model: str, version: str) -> Any:
        try:
            return self.registry.get(model, version or None).metadata
        except Exception:  # noqa: BLE001 - a version gone since the request: no monitors
            return None

    def _version_folder(self, model: str, version: str) -> Path | None:
        repository = self.registry.repository
        if repository is None or not version.isdigit():
            return None
        return Path(repository.version_dir(model, int(version)))

    def install(self, app: Any) -> None:
        from redline.monitoring.routes import install_routes

        install_routes(app, self)

    def count_rollbacks(self, rollouts: Any) -> None:
        """Export the rollbacks ``rollouts`` (``scaling.rollout.RolloutController``) decides,
        per model and check, as ``redline_rollout_rollbacks_total``."""
        self.rollouts = rollouts

    def label_joins(self, model: str, version: str) -> Any:
        """The quality monitor joining labels to ``model``'s ``version`` (None: none yet)."""
        return self.windows.quality.get((model, version))

    def prepare_loaded(self, wait: bool = False) -> None:
        """Drift and quality monitors for every loaded version, now: each reads its drift
        thresholds from beside the version, or calibrates them on a background thread (once
        per version: the result is kept there) before the first report needs them
        (``wait``: and returns when they are done). Drift reads "calibrating" meanwhile."""
        keys = []
        for name in self.registry.models():
            for handle in loaded_versions(self.registry, name):
                keys.append((name, handle.version_str))
        self.windows.prepare(keys)
        if wait:
            for key in keys:
                drift = self.windows.drift.get(key)
                if drift is not None:
                    drift.wait_calibrated()

    async def models_loaded(self) -> None:
        """Before the server's ports open: nothing to wait for. The drift thresholds are read
        from beside each version, or calibrated once in the background after the ports open
        (``run``), so a (re)started worker answers at once."""

    async def run(self) -> None:
        """The tick, until cancelled."""
        try:
            self.prepare_loaded()
        except Exception:  # noqa: BLE001 - monitoring must never take the server down
            log.exception("preparing the drift monitors failed")
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - monitoring must never take the server down
                log.exception("monitoring tick failed")

    def close(self) -> None:
        for drift in list(self.windows.drift.values()):
            drift.stop_calibration()  # a calibration still running ends with the server
        try:  # the last requests' predictions into a shared label join (a worker that drains)
            self.drain()
            self.windows.absorb()
        except Exception:  # noqa: BLE001 - monitoring must never stop a shutdown
            log.exception("writing the last predictions to the label join failed")
        if self.tracing is not None:
            self.tracing.close()
        if self.alerts is not None:
            self.alerts.close()

    # ------------------------------------------------------------------ the tick
    async def tick(self) -> None:
        now = time.monotonic()
        dt = max(1e-3, now - self._last_tick)
        self._last_tick = now
        self._ticks += 1
        await self.drain_in_slices()
        # The steps below run on the loop (they own what the loop folds into), in small steps
        # with requests let in between: whole, settle + percentiles + export were 1-1.7 ms
        # each in one piece, once a second, at 500 req/s.
        tick: dict[tuple[str, str, str], dict[str, Any]] = {}
        await _in_steps(self.metrics.take_tick_steps(tick))
        point = self.series.point(dt, tick)
        await asyncio.sleep(0)
        self.gauges.sample(point, self.rollouts)
        await asyncio.sleep(0)
        await _in_steps(self.export.flush_steps(self.metrics))
        if self.tracing is not None:
            self.export.count_to(self.export.trace_dropped, ("trace_dropped",),
                                 self.tracing.dropped)
        # numpy work for many requests at once, on a worker thread: the loop keeps serving.
        # The thread hands the GIL to the loop between units of a few hundred microseconds
        # (``handoff.py``): left to the interpreter, the loop waited up to 5 ms for it.
        evaluate = self._ticks % DRIFT_EVERY_TICKS == 0
        await to_thread_yielding(self._windows_work, evaluate)
        point["drift"] = self.reports.drifted()
        self.series.history.append(point)
        if self.alerts is not None and self._alert_leader:
            self.alerts.update({**self.reports.conditions(), **self.series.over_objective()})

    def refresh_metrics(self) -> None:
        """Bring the Prometheus metrics up to this moment (a scrape between two ticks)."""
        self.drain()
        self.gauges.sample(None, self.rollouts)
        self.export.flush(self.metrics)

    def _windows_work(self, evaluate: bool) -> None:
        self.windows.absorb()
        yield_to_loop()
        if evaluate:
            self.review.refresh()
        if self.alerts is not None:  # one worker of a pool sends the webhook (joinstore lease)
            self._alert_leader = self.windows.join.leads("alerts", max(3.0, 3 * self.tick_s))
        if not evaluate:
            return
        yield_to_loop()
        self.evaluate()

    def evaluate(self) -> None:
        """Drift and quality reports for every version with live traffic, into the gauges."""
        self.reports.evaluate()

    # ------------------------------------------------------------------ read side
    def summary(self, ticks: int = 60) -> dict[str, Any]:
        """The last ``ticks`` points of the time series and the latest drift, quality, review
        and alert state (``history_ticks``: how many points the server keeps)."""
        history = list(self.series.history)[-ticks:]
        return {
            "now": round(time.time(), 3), "tick_s": self.tick_s, "history": history,
            "history_ticks": HISTORY_TICKS,
            # with several workers these figures are this worker's (/metrics merges them all)
            "worker_pid": os.getpid(),
            "drift": self.reports.drift_briefs(),
            "quality": {f"{m}:{v}": r for (m, v), r in self.reports.quality.items()},
            "tracing": self.tracing.stats() if self.tracing is not None else None,
            "review": self.review.stats(fresh=False),  # refreshed by the tick
            "alerts": self.alerts.stats() if self.alerts is not None else None,
        }


async def _in_steps(steps: Iterator[None]) -> None:
    """Run ``steps`` on the loop, letting it serve others after each ~``STEP_S`` of them."""
    start = time.perf_counter()
    for _ in steps:
        if time.perf_counter() - start > STEP_S:
            await asyncio.sleep(0)
            start = time.perf_counter()
