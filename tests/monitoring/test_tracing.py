"""Spans from records: per stage, parent from traceparent, head and tail sampling, drops."""

from __future__ import annotations

import threading
import time

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from redline.monitoring.tracing import TraceExport, sampled_flag
from tests.monitoring.helpers import record

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def test_sampled_flag() -> None:
    assert sampled_flag(f"00-{TRACE}-{PARENT}-01")
    assert not sampled_flag(f"00-{TRACE}-{PARENT}-00")
    assert not sampled_flag("garbage")


def test_spans_per_stage_join_the_callers_trace() -> None:
    exporter = InMemorySpanExporter()
    tracing = TraceExport(exporter, sample_ratio=0.0, slow_ms=1000)
    r = record(stages={"decode": 10, "queue": 5, "inference": 40, "encode": 8},
               traceparent=f"00-{TRACE}-{PARENT}-01", request_id="abc")
    tracing.request_finished(r)
    assert tracing.flush()
    tracing.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"redline v2 m", "decode", "queue", "inference", "encode"}
    root = spans["redline v2 m"]
    assert format(root.context.trace_id, "032x") == TRACE
    assert format(root.parent.span_id, "016x") == PARENT
    assert root.attributes["redline.request_id"] == "abc"
    inference = spans["inference"]
    assert inference.parent.span_id == root.context.span_id
    assert inference.end_time - inference.start_time == 40_000
    assert inference.start_time - root.start_time == 15_000  # after decode and queue
    assert root.start_time == r.wall_ns


def test_head_sampling_and_tail_keep() -> None:
    exporter = InMemorySpanExporter()
    tracing = TraceExport(exporter, sample_ratio=0.0, slow_ms=1.0)  # 1 ms is slow
    tracing.request_finished(record())  # fast, unsampled: dropped by the head
    tracing.request_finished(record(traceparent=f"00-{TRACE}-{PARENT}-00"))  # caller: no
    tracing.request_finished(record(stages={"inference": 5000}, request_id="slow"))
    tracing.request_finished(record(status="overloaded", request_id="failed"))
    assert tracing.flush()
    tracing.close()
    roots = [s for s in exporter.get_finished_spans() if s.name.startswith("redline")]
    assert sorted(s.attributes["redline.request_id"] for s in roots) == ["failed", "slow"]
    failed = next(s for s in roots if s.attributes["redline.request_id"] == "failed")
    assert not failed.status.is_ok


def test_a_full_queue_drops_and_counts_and_export_errors_never_raise() -> None:
    entered, gate = threading.Event(), threading.Event()

    class Stuck(InMemorySpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            entered.set()
            gate.wait(5)  # a collector that hangs...
            raise RuntimeError("collector down")  # ...then fails

    tracing = TraceExport(Stuck(), sample_ratio=1.0, queue_size=10)
    tracing.request_finished(record())
    tracing._wake.set()
    assert entered.wait(5)  # the export thread is stuck in export()
    t = time.perf_counter()
    for _ in range(25):
        tracing.request_finished(record())
    assert time.perf_counter() - t < 0.05  # never blocked
    assert tracing.dropped == 15 and tracing.kept == 11
    gate.set()
    assert tracing.flush()
    tracing.close()
    assert tracing.failed_exports == 11 and tracing.exported == 0
