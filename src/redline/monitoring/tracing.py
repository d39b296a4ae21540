"""OpenTelemetry spans per stage, built after the request from its record.

Tracing in Python usually costs tens of microseconds per span on the request path. Here the
request path pays for one decision, made when the request has finished and before its response
is sent: keep this request's trace or not. Head sampling keeps a share of requests (and every
request whose W3C ``traceparent`` says the caller sampled it); the tail rule also keeps every
request that failed or was slower than its threshold. No OpenTelemetry object is made for it:
the decision picks the server span's id, and the response carries ``traceparent:
00-<trace>-<that span id>-<01 kept | 00 not>`` (HTTP header, gRPC trailing metadata) so a client
can find its trace. The monitor's tick hands the kept records to a bounded queue; a background
thread turns each into one server span with a child span per stage (real start and end times,
from the record's clock anchor, and the ids the response named) and exports them in batches,
about once a second. When the queue is full the record is dropped and counted: export never
blocks a request.

The parent of a request's span is the caller's ``traceparent`` (HTTP header or gRPC metadata),
so redline's spans join the caller's trace. Spans go to OTLP when ``monitoring.otlp_endpoint`` is
set (``pip install 'redline[otel]'``); nothing is exported by default.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redline.serving.stages import RequestRecord

log = logging.getLogger("redline.monitoring")

BATCH = 256
EXPORT_INTERVAL_S = 1.0  # a kept span waits at most this long (fewer, larger exports)
_HEX = frozenset("0123456789abcdef")


def parse_traceparent(traceparent: str | None) -> tuple[str, bool] | None:
    """``(trace id, sampled)`` of a valid W3C ``traceparent``, else None (then a new trace).

    Version 00 is read exactly; a later version by its first four fields, as the spec says."""
    if not traceparent or len(traceparent) < 55:
        return None
    tp = traceparent
    version, trace, parent, flags = tp[0:2], tp[3:35], tp[36:52], tp[53:55]
    if (tp[2] != "-" or tp[35] != "-" or tp[52] != "-" or version == "ff"
            or (version == "00" and len(tp) != 55) or (len(tp) > 55 and tp[55] != "-")
            or not _HEX.issuperset(version + trace + parent + flags)
            or trace == "0" * 32 or parent == "0" * 16):
        return None
    return trace, bool(int(flags, 16) & 1)


def sampled_flag(traceparent: str | None) -> bool:
    """True when a W3C traceparent (``00-<trace>-<span>-<flags>``) has the sampled bit."""
    if not traceparent or len(traceparent) < 55:
        return False
    try:
        return bool(int(traceparent[53:55], 16) & 1)
    except ValueError:
        return False


class TraceExport:
    """The request observer that decides, queues and (on its own thread) exports spans."""

    def __init__(self, exporter: Any, sample_ratio: float = 0.01,
                 slow_ms: Callable[[str], float] | float = 100.0,
                 queue_size: int = 2048) -> None:
        self.exporter = exporter
        self.sample_ratio = sample_ratio
        self._slow_ms = slow_ms
        self._slow_ns: dict[str, int] = {}
        self._queue: deque[RequestRecord] = deque()
        self.queue_size = queue_size
        self.kept = 0
        self.dropped = 0
        self.exported = 0
        self.failed_exports = 0
        self._wake = threading.Event()
        self._stop = False
        self._random = random.random
        self._bits = random.getrandbits
        self.fed_by_monitor = False  # set by ServerMonitor: its feed brings the records
        self._thread = threading.Thread(target=self._run, name="redline-trace-export",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ on the request path
    def response_traceparent(self, record: RequestRecord) -> str:
        """Decide now whether ``record``'s spans are kept, pick its server span's id, and
        return the ``traceparent`` its response carries (no OpenTelemetry object is made)."""
        parent = parse_traceparent(record.traceparent) if record.traceparent else None
        keep = self._keep(record, parent)
        record.trace_keep = keep
        trace = parent[0] if parent is not None else f"{self._bits(128):032x}"
        span = self._bits(64) or 1
        record.trace_id, record.span_id = trace, span
        return f"00-{trace}-{span:016x}-{'01' if keep else '00'}"

    def _keep(self, record: RequestRecord, parent: tuple[str, bool] | None = None) -> bool:
        if record.status != "ok":
            return True  # tail: every failure
        limit = self._slow_ns.get(record.model)
        if limit is None:
            ms = self._slow_ms(record.model) if callable(self._slow_ms) else self._slow_ms
            limit = self._slow_ns[record.model] = int(ms * 1e6)
        if (record.end_ns or record.start_ns) - record.start_ns > limit:
            return True  # tail: slower than the threshold
        if parent is not None:
            if parent[1]:
                return True  # head: the caller sampled this trace
        elif record.traceparent is not None and sampled_flag(record.traceparent):
            return True
        return self._random() < self.sample_ratio  # head: our own share

    # ------------------------------------------------------------------ on the tick
    def request_finished(self, record: RequestRecord) -> None:
        if not self.fed_by_monitor:  # the monitor's tick already folds every record in
            self.fold((record,))

    def fold(self, records: Iterable[RequestRecord]) -> None:
        """Queue the kept ones among finished records (decided at the response, or now)."""
        queue, size = self._queue, self.queue_size
        for record in records:
            keep = record.trace_keep
            if keep is None:
                keep = self._keep(record)
            if not keep:
                continue
            if len(queue) >= size:
                self.dropped += 1
                continue
            queue.append(record)
            self.kept += 1
        if len(queue) >= BATCH:
            self._wake.set()

    # ------------------------------------------------------------------ on the export thread
    def _run(self) -> None:
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        batch: list[Any] = []

        class _Collect(SpanProcessor):
            def on_end(self, span: Any) -> None:
                batch.append(span)

        class _Ids(RandomIdGenerator):
            """The ids the response named, for the next root span; random otherwise."""

            trace = 0
            span = 0

            def generate_trace_id(self) -> int:
                trace, self.trace = self.trace, 0
                return trace or super().generate_trace_id()

            def generate_span_id(self) -> int:
                span, self.span = self.span, 0
                return span or super().generate_span_id()

        ids = _Ids()
        provider = TracerProvider(sampler=ALWAYS_ON, id_generator=ids)
        provider.add_span_processor(_Collect())
        tracer = provider.get_tracer("redline")
        propagator = TraceContextTextMapPropagator()
        while not self._stop or self._queue:
            self._wake.wait(EXPORT_INTERVAL_S)
            self._wake.clear()
            while self._queue:
                n = 0
                while self._queue and n < BATCH:
                    self._build(tracer, propagator, ids, self._queue.popleft())
                    n += 1
                try:
                    self.exporter.export(list(batch))
                    self.exported += n
                except Exception:  # noqa: BLE001 - a collector outage must not kill the thread
                    self.failed_exports += n
                    log.warning("trace export failed for %d requests", n, exc_info=True)
                batch.clear()

    @staticmethod
    def _build(tracer: Any, propagator: Any, ids: Any, r: RequestRecord) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        context = (propagator.extract({"traceparent": r.traceparent})
                   if parse_traceparent(r.traceparent) is not None else None)
        if r.trace_id is not None:  # the response named these: the root span takes them
            ids.trace, ids.span = int(r.trace_id, 16), r.span_id
        base = r.wall_ns - r.start_ns
        end = r.end_ns or r.start_ns
        attributes = {"redline.api": r.api, "redline.transport": r.transport,
                      "redline.model": r.model, "redline.model_version": r.version,
                      "redline.path": r.path, "redline.status": r.status,
                      "redline.rows": r.rows}
        if r.request_id:
            attributes["redline.request_id"] = r.request_id
        root = tracer.start_span(f"redline {r.api} {r.model}", context=context,
                                 kind=SpanKind.SERVER, start_time=r.wall_ns,
                                 attributes=attributes)
        ids.trace = ids.span = 0  # (a caller's trace id left the preset trace id unused)
        if r.status != "ok":
            root.set_status(Status(StatusCode.ERROR, r.status))
        child_ctx = set_span_in_context(root)
        for stage, start, stop in r.spans:
            span = tracer.start_span(stage, context=child_ctx, start_time=base + start)
            span.end(end_time=base + stop)
        root.end(end_time=base + end)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything queued so far is exported (tests, shutdown)."""
        import time

        deadline = time.monotonic() + timeout_s
        target = self.kept
        while self.exported + self.failed_exports < target:
            self._wake.set()
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(5)
        shutdown = getattr(self.exporter, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def stats(self) -> dict[str, Any]:
        return {"sample_ratio": self.sample_ratio, "kept": self.kept, "dropped": self.dropped,
                "exported": self.exported, "failed_exports": self.failed_exports,
                "queued": len(self._queue)}


def otlp_exporter(endpoint: str) -> Any:
    """The OTLP/HTTP span exporter (optional dependency, extra ``otel``)."""
    from redline.errors import ConfigError

    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ConfigError("monitoring.otlp_endpoint is set but the OpenTelemetry exporter is "
                          "not installed: pip install 'redline[otel]'") from None
    return OTLPSpanExporter(endpoint=endpoint, timeout=5)
