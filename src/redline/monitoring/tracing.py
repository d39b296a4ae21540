"""Trace spans per stage, encoded straight into OTLP protobuf after the request, from its record.

Tracing in Python usually costs tens of microseconds per span on the request path. Here the
request path pays for one decision, made when the request has finished and before its response
is sent: keep this request's trace or not. Head sampling keeps a share of requests (and every
request whose W3C ``traceparent`` says the caller sampled it); the tail rule also keeps every
request that failed or was slower than its threshold. Nothing is built for it: for a kept
request, or one whose caller sent a ``traceparent``, the decision picks the trace and
server-span ids (one random draw, one string) and the response carries
``traceparent: 00-<trace>-<that span id>-<01 kept | 00 not>`` (HTTP header, gRPC trailing
metadata) so a client can find its trace; a request that is neither (most of them) is not
exported and no caller knows its trace, so it gets no ids and no header. The monitor's tick
hands the kept records to a bounded queue; a background thread encodes each as one server
span with a child span per stage (real start and end times, from the record's clock anchor,
and the ids the response named) directly into OTLP protobuf messages (``opentelemetry-proto``)
and posts them in batches, about once a second. No OpenTelemetry SDK span is made: SDK spans
plus their OTLP encoding cost ~160 µs per kept request, these messages ~15 µs. When the queue
is full the record is dropped and counted: export never blocks a request.

The parent of a request's span is the caller's ``traceparent`` (HTTP header or gRPC metadata),
so redline's spans join the caller's trace. Spans go over OTLP/HTTP (protobuf) when
``monitoring.otlp_endpoint`` is set (``pip install 'redline[otel]'``), or as Zipkin v2 JSON to
``monitoring.zipkin_endpoint`` with ``monitoring.trace_exporter: zipkin`` (no extra needed: the
same spans, ids and attributes, as Zipkin's span model says them); nothing is exported by
default. A batch the endpoint refuses or never answers is dropped and counted (one warning line
per outage), never retried: serving does not wait for it.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from redline.monitoring.outage_log import OutageLog

if TYPE_CHECKING:
    from redline.config.settings import MonitoringSettings
    from redline.serving.stages import RequestRecord

log = logging.getLogger("redline.monitoring")

BATCH = 256
EXPORT_INTERVAL_S = 1.0  # a kept span waits at most this long (fewer, larger exports)
_HEX = frozenset("0123456789abcdef")
_ZERO_SPAN = "0" * 16
_ZERO_TRACE = "0" * 32
_MASK64 = (1 << 64) - 1
_FLAGS = ("00", "01")  # the traceparent flags, by keep (False, True)


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


class SpanSink(Protocol):
    """Where encoded spans go: ``send`` one OTLP ``ExportTraceServiceRequest`` (protobuf
    bytes), or what the sink's own ``encode(records, service)`` makes when it has one (Zipkin
    JSON); raising means the batch was not delivered (dropped and counted, never retried).

    ``send`` is all an embedder's sink must have (``ServerMonitor.use_trace_exporter``, as
    docs/observability.md says): ``encode``, ``close()`` (at shutdown) and ``endpoint`` (named
    in the outage log) are optional, so :class:`TraceExport` looks those three up."""

    def send(self, payload: bytes) -> None: ...


class TraceExport:
    """The request observer that decides, queues and (on its own thread) exports spans."""

    def __init__(self, sink: SpanSink, sample_ratio: float = 0.01,
                 slow_ms: Callable[[str], float] | float = 100.0,
                 queue_size: int = 2048, service: str = "redline",
                 fed_by_monitor: bool = False) -> None:
        self.sink = sink
        # the sink's wire format: OTLP protobuf unless it encodes spans its own way (Zipkin)
        self._encode: Callable[[list[RequestRecord], str], bytes] = (
            getattr(sink, "encode", None) or encode_spans)
        self.sample_ratio = sample_ratio
        self.service = service
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
        # True when a ServerMonitor's feed brings the records (its tick folds them in); False:
        # this is a request observer of its own (``request_finished``)
        self.fed_by_monitor = fed_by_monitor
        self._outage = OutageLog(log, "trace export to",
                                 str(getattr(sink, "endpoint", type(sink).__name__)))
        self._thread = threading.Thread(target=self._run, name="redline-trace-export",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ on the request path
    def response_traceparent(self, record: RequestRecord) -> str | None:
        """Decide now whether ``record``'s spans are kept and return the ``traceparent`` its
        response carries, or None when there is nothing to name.

        The common request (no caller ``traceparent``, answered ok and in time, not in the
        head sample) pays for the decision alone: a dict lookup, a comparison and one random
        draw. Its trace is not exported and no caller knows it, so its response names none and
        no ids are made (~1 µs a request). A kept request, or one whose caller sent a
        ``traceparent``, gets its trace (the caller's or a new one) and server span ids, named
        in the response and copied onto the record for the export."""
        caller = record.traceparent
        if caller is None and record.status == "ok":  # the common case, without the calls
            limit = self._slow_ns.get(record.model)
            head = record.trace_keep  # the head sample when drawn already (StageTimes)
            if limit is None:
                limit = self.slow_ns(record.model)  # the model's first request
            # tail (slower than the threshold), else head (our share)
            keep = (record.end_ns - record.start_ns > limit
                    or (self._random() < self.sample_ratio if head is None else head))
            record.trace_keep = keep
            if not keep:
                return None
            parent = None
        else:
            parent = parse_traceparent(caller) if caller is not None else None
            keep = record.trace_keep = self._keep(record, parent)
        if parent is None:
            bits = self._bits(192)  # a new trace id (128 bits) and the server span's id (64)
            if not bits & _MASK64 or not bits >> 64:
                bits |= 1 | (1 << 64)  # an all-zero id is invalid (W3C); once in 2^64
            ids = bits.to_bytes(24, "big").hex()  # 2x faster than formatting the two ints
            header = f"00-{ids[:32]}-{ids[32:]}-{_FLAGS[keep]}"
        else:
            span = self._bits(64) or 1
            header = f"00-{parent[0]}-{span:016x}-{_FLAGS[keep]}"
        if keep:
            record.trace_id, record.span_id = header[3:35], header[36:52]
        return header

    def slow_ns(self, model: str) -> int:
        """The duration (ns) beyond which ``model``'s requests are always kept."""
        limit = self._slow_ns.get(model)
        if limit is None:
            ms = self._slow_ms(model) if callable(self._slow_ms) else self._slow_ms
            limit = self._slow_ns[model] = int(ms * 1e6)
        return limit

    def _keep(self, record: RequestRecord, parent: tuple[str, bool] | None = None) -> bool:
        if record.status != "ok":
            return True  # tail: every failure
        limit = self.slow_ns(record.model)
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
        queue = self._queue
        while not self._stop or queue:
            self._wake.wait(EXPORT_INTERVAL_S)
            self._wake.clear()
            while queue:
                batch = [queue.popleft() for _ in range(min(BATCH, len(queue)))]
                try:
                    self.sink.send(self._encode(batch, self.service))
                    self.exported += len(batch)
                except Exception as exc:  # noqa: BLE001 - an outage must not kill the thread
                    self.failed_exports += len(batch)
                    self.dropped += len(batch)  # not delivered, as a full queue's are not
                    self._outage.failed(exc, f"for {len(batch)} requests, dropped")

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
        close = getattr(self.sink, "close", None)
        if close is not None:
            close()

    def stats(self) -> dict[str, Any]:
        return {"sample_ratio": self.sample_ratio, "kept": self.kept, "dropped": self.dropped,
                "exported": self.exported, "failed_exports": self.failed_exports,
                "queued": len(self._queue)}


def encode_spans(records: list[RequestRecord], service: str = "redline") -> bytes:
    """Kept records as one OTLP ``ExportTraceServiceRequest``: per record a server span
    (``redline <api> <model>``, child of the caller's span when it sent a ``traceparent``, with
    the ids its response named) and one child span per stage, in real wall-clock time."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    server_kind, internal_kind = Span.SPAN_KIND_SERVER, Span.SPAN_KIND_INTERNAL
    error = Status.STATUS_CODE_ERROR
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    attribute = resource_spans.resource.attributes.add()
    attribute.key = "service.name"
    attribute.value.string_value = service
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "redline"
    spans = scope_spans.spans
    fromhex = bytes.fromhex
    for r in records:
        caller = r.traceparent
        parent = parse_traceparent(caller) if caller is not None else None
        trace_hex = r.trace_id or (parent[0] if parent is not None else os.urandom(16).hex())
        trace = fromhex(trace_hex)
        # One draw for the server span (unless the response named it) and every stage span.
        ids = os.urandom(8 * (len(r.spans) + 1))
        root_id = fromhex(r.span_id) if r.span_id else ids[-8:]
        base = r.wall_ns - r.start_ns
        root = spans.add()
        root.trace_id = trace
        root.span_id = root_id
        if parent is not None and caller is not None:
            root.parent_span_id = fromhex(caller[36:52])
        root.name = f"redline {r.api} {r.model}"
        root.kind = server_kind
        root.start_time_unix_nano = r.wall_ns
        root.end_time_unix_nano = base + (r.end_ns or r.start_ns)
        attributes = root.attributes
        for key, value in (("redline.api", r.api), ("redline.transport", r.transport),
                           ("redline.model", r.model), ("redline.model_version", r.version),
                           ("redline.path", r.path), ("redline.status", r.status)):
            kv = attributes.add()
            kv.key = key
            kv.value.string_value = value
        kv = attributes.add()
        kv.key = "redline.rows"
        kv.value.int_value = r.rows
        if r.request_id:
            kv = attributes.add()
            kv.key = "redline.request_id"
            kv.value.string_value = r.request_id
        if r.status != "ok":
            root.status.code = error
            root.status.message = r.status
        for i, (stage, start, stop) in enumerate(r.spans):
            span = spans.add()
            span.trace_id = trace
            span.span_id = ids[8 * i: 8 * i + 8]
            span.parent_span_id = root_id
            span.name = stage
            span.kind = internal_kind
            span.start_time_unix_nano = base + start
            span.end_time_unix_nano = base + stop
    return request.SerializeToString()  # type: ignore[no-any-return]


class OtlpHttpSink:
    """Posts OTLP/HTTP protobuf to a collector (``monitoring.otlp_endpoint``), on one kept-alive
    connection; a failed post is reported to the caller and the connection made again."""

    setting = "monitoring.otlp_endpoint"
    example = "http://127.0.0.1:4318/v1/traces"
    content_type = "application/x-protobuf"
    receiver = "the OTLP collector"

    def __init__(self, endpoint: str, timeout_s: float = 5.0) -> None:
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            from redline.errors import ConfigError

            raise ConfigError(f"{self.setting} must be an http(s) URL, got "
                              f"{endpoint!r} (e.g. {self.example})")
        self.endpoint = endpoint
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port
        self._path = (url.path or urlsplit(self.example).path) + (
            f"?{url.query}" if url.query else "")
        self._timeout = timeout_s
        self._conn: Any = None

    def send(self, payload: bytes) -> None:
        import http.client

        if self._conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = kind(self._host, self._port, timeout=self._timeout)
        try:
            self._conn.request("POST", self._path, payload,
                               {"content-type": self.content_type})
            response = self._conn.getresponse()
            response.read()
        except Exception:
            self.close()
            raise
        if not 200 <= response.status < 300:
            raise RuntimeError(f"{self.receiver} answered {response.status} "
                               f"{response.reason} at {self.endpoint}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def otlp_exporter(endpoint: str) -> OtlpHttpSink:
    """The OTLP/HTTP span sink (optional dependency, extra ``otel``: the OTLP protobuf
    messages)."""
    from redline.errors import ConfigError

    try:
        import opentelemetry.proto.collector.trace.v1.trace_service_pb2  # noqa: F401
    except ImportError:
        raise ConfigError("monitoring.otlp_endpoint is set but the OTLP protobuf messages are "
                          "not installed: pip install 'redline[otel]'") from None
    return OtlpHttpSink(endpoint)


class ZipkinHttpSink(OtlpHttpSink):
    """Posts Zipkin v2 JSON (``POST /api/v2/spans``) to ``monitoring.zipkin_endpoint``: Zipkin
    itself, Jaeger's or the OpenTelemetry Collector's Zipkin receiver."""

    setting = "monitoring.zipkin_endpoint"
    example = "http://127.0.0.1:9411/api/v2/spans"
    content_type = "application/json"
    receiver = "the Zipkin endpoint"

    @staticmethod
    def encode(records: list[RequestRecord], service: str = "redline") -> bytes:
        return encode_zipkin(records, service)


def _micros(ns: int) -> int:
    return ns // 1000


def encode_zipkin(records: list[RequestRecord], service: str = "redline") -> bytes:
    """Kept records as one Zipkin v2 ``ListOfSpans`` (JSON): the spans :func:`encode_spans`
    makes, in Zipkin's model — lowercase hex ids, ``parentId`` for nesting, epoch microseconds
    and durations of at least 1 µs, ``localEndpoint.serviceName``, the attributes as string
    tags, and ``error`` (the status) on a failed request's server span."""
    import orjson

    spans: list[dict[str, Any]] = []
    endpoint = {"serviceName": service.lower()}
    for r in records:
        caller = r.traceparent
        parent = parse_traceparent(caller) if caller is not None else None
        trace = r.trace_id or (parent[0] if parent is not None else os.urandom(16).hex())
        ids = os.urandom(8 * (len(r.spans) + 1)).hex()
        root_id = r.span_id or ids[-16:]
        base = r.wall_ns - r.start_ns
        start = r.wall_ns
        tags = {"redline.api": r.api, "redline.transport": r.transport,
                "redline.model": r.model, "redline.model_version": r.version,
                "redline.path": r.path, "redline.status": r.status, "redline.rows": str(r.rows)}
        if r.request_id:
            tags["redline.request_id"] = r.request_id
        if r.status != "ok":
            tags["error"] = r.status
        root: dict[str, Any] = {
            "traceId": trace, "id": root_id, "name": f"redline {r.api} {r.model}".lower(),
            "kind": "SERVER", "timestamp": _micros(start),
            "duration": max(1, _micros((r.end_ns or r.start_ns) - r.start_ns)),
            "localEndpoint": endpoint, "tags": tags}
        if parent is not None and caller is not None:
            root["parentId"] = caller[36:52]
        spans.append(root)
        for i, (stage, begin, stop) in enumerate(r.spans):
            spans.append({"traceId": trace, "id": ids[16 * i: 16 * i + 16], "parentId": root_id,
                          "name": stage.lower(), "timestamp": _micros(base + begin),
                          "duration": max(1, _micros(stop - begin)),
                          "localEndpoint": endpoint})
    return orjson.dumps(spans)


def span_sink(monitoring: MonitoringSettings) -> OtlpHttpSink | None:
    """The span sink ``monitoring`` settings ask for (``trace_exporter``: otlp, with
    ``otlp_endpoint``, or zipkin, with ``zipkin_endpoint``); None: tracing is off."""
    from redline.errors import ConfigError

    if monitoring.trace_exporter == "zipkin":
        endpoint = monitoring.zipkin_endpoint
        if not endpoint:
            raise ConfigError("monitoring.trace_exporter is zipkin but monitoring.zipkin_endpoint "
                              "is not set: set it to the Zipkin collector's URL (e.g. "
                              f"{ZipkinHttpSink.example})")
        return ZipkinHttpSink(endpoint)
    if monitoring.otlp_endpoint:
        return otlp_exporter(monitoring.otlp_endpoint)
    return None
