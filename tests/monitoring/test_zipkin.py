"""Zipkin export (``monitoring.trace_exporter: zipkin``): the spans OTLP carries, as Zipkin v2
JSON, received by a real local HTTP endpoint and checked against Zipkin's v2 span model; from a
served redline; and a Zipkin endpoint that is down (a warning, spans dropped and counted,
serving unaffected)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from redline.errors import ConfigError
from redline.monitoring.tracing import TraceExport, ZipkinHttpSink, encode_spans, span_sink
from tests.conftest import free_port
from tests.monitoring.helpers import record
from tests.monitoring.otlp import decode
from tests.monitoring.served import make_repository, monitored_settings, training_data, v2_body
from tests.serving.helpers import ServerThread

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
HEX16, HEX32 = re.compile(r"^[0-9a-f]{16}$"), re.compile(r"^[0-9a-f]{32}$")
# Zipkin's v2 span model (zipkin2-api.yaml: Span, Endpoint, Tags)
SPAN_FIELDS = {"traceId", "name", "parentId", "id", "kind", "timestamp", "duration", "debug",
               "shared", "localEndpoint", "remoteEndpoint", "annotations", "tags"}
KINDS = {"CLIENT", "SERVER", "PRODUCER", "CONSUMER"}


def check_zipkin_span(span: dict[str, Any]) -> None:
    """One span against Zipkin's v2 model: lowercase hex ids of the right widths, epoch
    microseconds and a duration of at least 1 µs as integers, a lowercase name and service,
    tags a map of strings."""
    assert set(span) <= SPAN_FIELDS, set(span) - SPAN_FIELDS
    assert HEX32.match(span["traceId"]) or HEX16.match(span["traceId"]), span
    assert HEX16.match(span["id"]), span
    if "parentId" in span:
        assert HEX16.match(span["parentId"]) and span["parentId"] != span["id"], span
    if "kind" in span:
        assert span["kind"] in KINDS, span
    assert isinstance(span["timestamp"], int) and isinstance(span["duration"], int)
    # epoch microseconds: after 2001, before 2286 (milliseconds or nanoseconds fall outside)
    assert 10**15 <= span["timestamp"] < 10**16 or span["timestamp"] < 10**13, span
    assert span["duration"] >= 1
    assert span["name"] == span["name"].lower()
    service = span["localEndpoint"]["serviceName"]
    assert service and service == service.lower()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in span.get("tags", {}).items())


class ZipkinReceiver:
    """A Zipkin collector on a free port: ``POST /api/v2/spans`` bodies are parsed and kept
    (202, as Zipkin answers), or refused with ``status``."""

    def __init__(self, port: int = 0, status: int = 202) -> None:
        self.spans: list[dict[str, Any]] = []
        self.content_types: list[str] = []
        self.paths: list[str] = []
        self.status = status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.paths.append(self.path)
                receiver.content_types.append(self.headers["content-type"])
                if receiver.status == 202:
                    receiver.spans.extend(orjson.loads(body))
                self.send_response(receiver.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}/api/v2/spans"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[ZipkinReceiver]:
    r = ZipkinReceiver()
    yield r
    r.close()


def test_zipkin_export_is_the_otlp_spans_in_zipkins_model(receiver: ZipkinReceiver) -> None:
    records = [record(stages={"decode": 10, "queue": 5, "inference": 40, "encode": 8},
                      traceparent=f"00-{TRACE}-{PARENT}-01", request_id="joined"),
               record(model="Fraud", version="7", status="overloaded", request_id="failed",
                      start_ns=2_000_000_000)]
    tracing = TraceExport(ZipkinHttpSink(receiver.endpoint), sample_ratio=0.0, slow_ms=1000)
    for r in records:
        tracing.request_finished(r)
    assert tracing.flush()
    tracing.close()
    assert tracing.exported == 2 and tracing.failed_exports == 0
    assert set(receiver.content_types) == {"application/json"}
    assert set(receiver.paths) == {"/api/v2/spans"}
    spans = receiver.spans
    for span in spans:
        check_zipkin_span(span)
    roots = {s["tags"]["redline.request_id"]: s for s in spans if s.get("kind") == "SERVER"}
    joined, failed = roots["joined"], roots["failed"]
    # nesting: the caller's span is the server span's parent; every stage is a child of it
    assert joined["traceId"] == TRACE and joined["parentId"] == PARENT
    assert "parentId" not in failed and failed["traceId"] != TRACE
    stages = [s for s in spans if s.get("kind") is None]
    assert len(stages) == 8
    for root, r in ((joined, records[0]), (failed, records[1])):
        children = [s for s in stages if s["parentId"] == root["id"]]
        assert [c["name"] for c in children] == ["decode", "queue", "inference", "encode"]
        assert all(c["traceId"] == root["traceId"] for c in children)
        # real wall-clock time in microseconds: the record's start, stage lengths as timed
        assert root["timestamp"] == r.wall_ns // 1000
        assert root["duration"] == (r.end_ns - r.start_ns) // 1000 == 65
        assert [c["duration"] for c in children] == [10, 5, 40, 8]
        assert children[2]["timestamp"] - root["timestamp"] == 15  # after decode and queue
        assert root["localEndpoint"] == {"serviceName": "redline"}
    assert len({s["id"] for s in spans}) == 10
    # tags: model, version and status, as OTLP's attributes say them (values as strings)
    assert joined["tags"]["redline.model"] == "m" and joined["tags"]["redline.status"] == "ok"
    assert failed["tags"]["redline.model"] == "Fraud" and failed["name"] == "redline v2 fraud"
    assert failed["tags"]["redline.model_version"] == "7"
    assert failed["tags"]["redline.status"] == "overloaded" and failed["tags"]["error"]
    otlp = {s.attributes["redline.request_id"]: s for s in decode(encode_spans(records))
            if s.name.startswith("redline ")}
    for rid, root in roots.items():
        want = {k: str(v) for k, v in otlp[rid].attributes.items()}
        assert {k: v for k, v in root["tags"].items() if k != "error"} == want


def test_span_sink_follows_the_settings() -> None:
    settings = monitored_settings()
    mon = settings.monitoring
    assert span_sink(mon) is None  # nothing configured: tracing off
    mon.trace_exporter = "zipkin"
    with pytest.raises(ConfigError, match="zipkin_endpoint is not set"):
        span_sink(mon)
    mon.zipkin_endpoint = "127.0.0.1:9411"
    with pytest.raises(ConfigError, match=r"zipkin_endpoint must be an http\(s\) URL"):
        span_sink(mon)
    mon.zipkin_endpoint = "http://127.0.0.1:9411/api/v2/spans"
    assert isinstance(span_sink(mon), ZipkinHttpSink)


def _served(tmp: Path, endpoint: str) -> ServerThread:
    settings = monitored_settings()
    settings.monitoring.trace_exporter = "zipkin"
    settings.monitoring.zipkin_endpoint = endpoint
    settings.monitoring.trace_sample_ratio = 1.0
    return ServerThread(settings, make_repository(tmp)).start()


def _metric(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


def test_a_served_redline_exports_zipkin_spans(receiver: ZipkinReceiver, tmp_path) -> None:
    server = _served(tmp_path, receiver.endpoint)
    try:
        rng = np.random.default_rng(2)
        with httpx.Client(base_url=server.http, headers={"x-redline-budget-ms": "5000"}) as http:
            r = http.post("/v2/models/fraud/infer", json=v2_body(training_data(rng, 1), "z1"),
                          headers={"traceparent": f"00-{TRACE}-{PARENT}-01"})
            assert r.status_code == 200
            named = r.headers["traceparent"].split("-")
        deadline = time.monotonic() + 10
        while not any(s.get("kind") == "SERVER" for s in receiver.spans):
            assert time.monotonic() < deadline, "no span reached the Zipkin endpoint"
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        server.stop()
    root = next(s for s in receiver.spans if s.get("kind") == "SERVER")
    for span in receiver.spans:
        check_zipkin_span(span)
    assert (root["traceId"], root["id"], root["parentId"]) == (TRACE, named[2], PARENT)
    assert root["tags"]["redline.model"] == "fraud" and root["tags"]["redline.status"] == "ok"
    assert root["tags"]["redline.model_version"] and root["tags"]["redline.request_id"] == "z1"
    children = [s for s in receiver.spans if s.get("parentId") == root["id"]]
    assert children and all(c["traceId"] == TRACE for c in children)
    assert sum(c["duration"] for c in children) <= root["duration"] + len(children)


def test_a_zipkin_endpoint_that_is_down_drops_counts_and_warns(
        tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}/api/v2/spans"
    rng = np.random.default_rng(3)
    with caplog.at_level(logging.WARNING, "redline.monitoring"):
        server = _served(tmp_path, endpoint)
        try:
            with httpx.Client(base_url=server.http,
                              headers={"x-redline-budget-ms": "5000"}) as http:
                for i in range(20):  # serving unaffected: every request answered
                    r = http.post("/v2/models/fraud/infer",
                                  json=v2_body(training_data(rng, 1), f"d{i}"))
                    assert r.status_code == 200 and r.json()["outputs"]
                monitor: Any = server.server.monitor
                tracing = monitor.tracing
                deadline = time.monotonic() + 15
                while tracing.dropped < 20:
                    assert time.monotonic() < deadline, tracing.stats()
                    time.sleep(0.1)
                while True:  # a tick (every 0.2 s here) brings the count into the metrics
                    dropped = _metric(http.get("/metrics").text,
                                      "redline_trace_spans_dropped_total")
                    if dropped >= 20 or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
        finally:
            server.stop()
    assert tracing.exported == 0 and tracing.failed_exports >= 20
    assert dropped >= 20
    # one warning naming the endpoint and saying what happened, no traceback
    lines = [r for r in caplog.records if r.name == "redline.monitoring"
             and "trace export" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    message = lines[0].getMessage()
    assert endpoint in message and "dropped" in message and lines[0].exc_info is None
