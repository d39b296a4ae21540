"""A real OTLP/HTTP receiver for the tracing tests, and the spans it received, decoded."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from redline.monitoring.tracing import SpanSink


@dataclass
class Span:
    """One received span, with hex ids (``parent`` is "" for a root)."""

    name: str
    trace_id: str
    span_id: str
    parent: str
    kind: int
    start: int
    end: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: bool = False
    service: str = ""


def decode(payload: bytes) -> list[Span]:
    """The spans of one OTLP ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest.FromString(payload)
    out = []
    for rs in request.resource_spans:
        service = next((a.value.string_value for a in rs.resource.attributes
                        if a.key == "service.name"), "")
        for ss in rs.scope_spans:
            for s in ss.spans:
                attrs = {a.key: getattr(a.value, a.value.WhichOneof("value"))
                         for a in s.attributes}
                out.append(Span(s.name, s.trace_id.hex(), s.span_id.hex(),
                                s.parent_span_id.hex(), s.kind, s.start_time_unix_nano,
                                s.end_time_unix_nano, attrs,
                                s.status.code == s.status.STATUS_CODE_ERROR, service))
    return out


SERVER = ProtoSpan.SPAN_KIND_SERVER


class MemorySink(SpanSink):
    """A ``SpanSink`` that keeps what it is sent (decoded)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.payloads = 0

    def send(self, payload: bytes) -> None:
        self.payloads += 1
        self.spans.extend(decode(payload))


class OtlpReceiver:
    """An OTLP/HTTP collector on a free port: POSTed protobuf batches are decoded and kept."""

    def __init__(self, status: int = 200) -> None:
        self.spans: list[Span] = []
        self.status = status
        self.content_types: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.content_types.append(self.headers["content-type"])
                if receiver.status == 200:
                    receiver.spans.extend(decode(body))
                self.send_response(receiver.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
