"""Spans from records: per stage, parent from traceparent, head and tail sampling, drops, and
OTLP/HTTP protobuf export to a real receiver."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from redline.errors import ConfigError
from redline.monitoring.tracing import OtlpHttpSink, TraceExport, encode_spans, sampled_flag
from tests.monitoring.helpers import record
from tests.monitoring.otlp import SERVER, MemorySink, OtlpReceiver, decode

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def test_sampled_flag() -> None:
    assert sampled_flag(f"00-{TRACE}-{PARENT}-01")
    assert not sampled_flag(f"00-{TRACE}-{PARENT}-00")
    assert not sampled_flag("garbage")


def test_spans_per_stage_join_the_callers_trace() -> None:
    sink = MemorySink()
    tracing = TraceExport(sink, sample_ratio=0.0, slow_ms=1000)
    r = record(stages={"decode": 10, "queue": 5, "inference": 40, "encode": 8},
               traceparent=f"00-{TRACE}-{PARENT}-01", request_id="abc")
    tracing.request_finished(r)
    assert tracing.flush()
    tracing.close()
    spans = {s.name: s for s in sink.spans}
    assert set(spans) == {"redline v2 m", "decode", "queue", "inference", "encode"}
    root = spans["redline v2 m"]
    assert root.trace_id == TRACE and root.parent == PARENT and root.kind == SERVER
    assert root.attributes["redline.request_id"] == "abc"
    assert root.attributes["redline.rows"] == 1 and root.service == "redline"
    inference = spans["inference"]
    assert inference.parent == root.span_id and inference.trace_id == TRACE
    assert inference.end - inference.start == 40_000
    assert inference.start - root.start == 15_000  # after decode and queue
    assert root.start == r.wall_ns and root.end - root.start == 65_000
    assert len({s.span_id for s in sink.spans}) == 5  # every span its own id


def test_the_ids_the_response_named_are_the_exported_ids() -> None:
    sink = MemorySink()
    tracing = TraceExport(sink, sample_ratio=1.0, slow_ms=1000, fed_by_monitor=True)
    named = {}
    for caller in (None, f"00-{TRACE}-{PARENT}-00"):
        r = record(traceparent=caller, request_id=str(caller))
        header = tracing.response_traceparent(r)
        assert header is not None
        version, trace, span, flags = header.split("-")
        assert version == "00" and flags == "01" and len(trace) == 32 and len(span) == 16
        named[str(caller)] = (trace, span)
        tracing.fold([r])
    assert named[f"00-{TRACE}-{PARENT}-00"][0] == TRACE  # the caller's trace is kept
    assert tracing.flush()
    tracing.close()
    roots = {s.attributes["redline.request_id"]: s for s in sink.spans
             if s.name.startswith("redline ")}
    for rid, (trace, span) in named.items():
        assert (roots[rid].trace_id, roots[rid].span_id) == (trace, span)
    assert roots["None"].parent == "" and roots[f"00-{TRACE}-{PARENT}-00"].parent == PARENT


def test_head_sampling_and_tail_keep() -> None:
    sink = MemorySink()
    tracing = TraceExport(sink, sample_ratio=0.0, slow_ms=1.0)  # 1 ms is slow
    tracing.request_finished(record())  # fast, unsampled: dropped by the head
    tracing.request_finished(record(traceparent=f"00-{TRACE}-{PARENT}-00"))  # caller: no
    tracing.request_finished(record(stages={"inference": 5000}, request_id="slow"))
    tracing.request_finished(record(status="overloaded", request_id="failed"))
    assert tracing.flush()
    tracing.close()
    roots = [s for s in sink.spans if s.name.startswith("redline")]
    assert sorted(s.attributes["redline.request_id"] for s in roots) == ["failed", "slow"]
    failed = next(s for s in roots if s.attributes["redline.request_id"] == "failed")
    assert failed.error and failed.attributes["redline.status"] == "overloaded"
    assert not next(s for s in roots if s.attributes["redline.request_id"] == "slow").error


def test_a_full_queue_drops_and_counts_and_export_errors_never_raise() -> None:
    entered, gate = threading.Event(), threading.Event()

    class Stuck(MemorySink):
        def send(self, payload: bytes) -> None:
            entered.set()
            gate.wait(5)  # a collector that hangs...
            raise RuntimeError("collector down")  # ...then fails

    tracing = TraceExport(Stuck(), sample_ratio=1.0, queue_size=10)
    tracing.request_finished(record())
    tracing._wake.set()
    assert entered.wait(5)  # the export thread is stuck in send()
    t = time.perf_counter()
    for _ in range(25):
        tracing.request_finished(record())
    assert time.perf_counter() - t < 0.05  # never blocked
    assert tracing.dropped == 15 and tracing.kept == 11
    gate.set()
    assert tracing.flush()
    tracing.close()
    assert tracing.failed_exports == 11 and tracing.exported == 0


def test_otlp_http_export_to_a_real_receiver_and_its_failures(
        caplog: pytest.LogCaptureFixture) -> None:
    receiver = OtlpReceiver()
    try:
        sink = OtlpHttpSink(receiver.endpoint)
        tracing = TraceExport(sink, sample_ratio=1.0)
        for i in range(300):  # more than one batch
            tracing.request_finished(record(request_id=f"r{i}"))
        assert tracing.flush()
        assert tracing.exported == 300 and tracing.failed_exports == 0
        roots = [s for s in receiver.spans if s.name == "redline v2 m"]
        assert sorted(s.attributes["redline.request_id"] for s in roots) == sorted(
            f"r{i}" for i in range(300))
        assert len(receiver.spans) == 300 * 5
        assert set(receiver.content_types) == {"application/x-protobuf"}
        receiver.status = 503  # the collector refuses: counted, and the thread goes on
        with caplog.at_level(logging.WARNING, "redline.monitoring"):
            for i in range(3):
                tracing.request_finished(record(request_id=f"refused{i}"))
                assert tracing.flush()
        assert tracing.failed_exports == 3
        # One WARNING line naming the collector and the reason, no traceback, rate-limited.
        lines = [r for r in caplog.records if r.name == "redline.monitoring"]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        assert lines[0].exc_info is None and receiver.endpoint in lines[0].getMessage()
        assert "503" in lines[0].getMessage()
        receiver.status = 200
        tracing.request_finished(record(request_id="after"))
        assert tracing.flush()
        assert tracing.exported == 301
        tracing.close()
    finally:
        receiver.close()
    with pytest.raises(ConfigError, match="http"):
        OtlpHttpSink("127.0.0.1:4318")


def test_encode_spans_is_valid_otlp_for_records_never_named() -> None:
    """Records fed straight to the export (no response named their ids) get fresh ids."""
    spans = decode(encode_spans([record(), record(status="internal")]))
    roots = [s for s in spans if s.kind == SERVER]
    assert len(roots) == 2 and len({s.trace_id for s in roots}) == 2
    assert all(len(s.trace_id) == 32 and len(s.span_id) == 16 for s in spans)
    assert [s.error for s in roots] == [False, True]


def test_a_new_trace_is_named_only_when_its_spans_are_kept() -> None:
    """Without a caller's traceparent (the common case): an answer the tail rule keeps (slow)
    names a fresh trace and span id, 01, and exactly those ids are exported, also once the
    model's slow threshold is known; one head sampling leaves out gets no ids and no header
    (nothing exported it, no caller knows it: the request path makes none)."""
    sink = MemorySink()
    tracing = TraceExport(sink, sample_ratio=0.0, slow_ms=1.0,  # 1 ms is slow
                          fed_by_monitor=True)
    named: dict[str, tuple[str, str]] = {}
    traces = set()
    for rid, stages in (("first", None), ("fast", None), ("slow", {"inference": 5000}),
                        ("slow-again", {"inference": 2000}), ("fast-again", None)):
        r = record(stages=stages, request_id=rid)
        header = tracing.response_traceparent(r)
        if not rid.startswith("slow"):
            assert header is None and r.trace_keep is False and r.trace_id is None, rid
            tracing.fold([r])
            continue
        assert header is not None
        version, trace, span, flags = header.split("-")
        assert version == "00" and len(trace) == 32 and len(span) == 16
        assert int(trace, 16) and int(span, 16) and trace not in traces
        traces.add(trace)
        assert flags == "01", rid
        named[rid] = (trace, span)
        tracing.fold([r])
    assert tracing.flush()
    tracing.close()
    roots = {s.attributes["redline.request_id"]: s for s in sink.spans
             if s.name.startswith("redline ")}
    assert set(roots) == {"slow", "slow-again"}
    for rid, root in roots.items():
        assert (root.trace_id, root.span_id) == named[rid] and root.parent == ""
