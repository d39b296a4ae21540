"""How an edge ends a request (``request_end.RequestEnd``), and which way the packages import.

``RequestEnd.finish`` is each edge's one monitoring call: with nobody observing it only
finishes the record; with the monitor's real feed it keeps a common ``/v1`` request's stage
times instead of its record, hands any other record over and names the answer's trace."""

from __future__ import annotations

import subprocess
import sys

from redline.config import Settings
from redline.monitoring.monitor import RecordFeed, ServerMonitor
from redline.monitoring.stage_times import SPILL_ROWS
from redline.serving.observers import Observers, StageTimesObserver, TracingObserver
from redline.serving.request_end import RequestEnd
from redline.serving.stages import NEVER, RequestRecord, v1_times
from tests.monitoring.helpers import idle_monitor

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def v1_record(**fields: object) -> RequestRecord:
    record = RequestRecord("v1", "rest")
    record.model, record.version, record.rows = "cards", "1", 1
    record.add("decode", record.start_ns, record.start_ns + 1000)
    for key, value in fields.items():
        setattr(record, key, value)
    return record


def monitored() -> tuple[RecordFeed, Observers]:
    settings = Settings()
    settings.monitoring.trace_sample_ratio = 0.0
    feed = idle_monitor(settings).feed
    return feed, Observers([feed])


def test_unobserved_it_only_finishes_the_record() -> None:
    end = RequestEnd(Observers(), "v1", "rest", v1_times)
    record = v1_record()
    assert end.finish(record, "invalid_input") is None
    assert record.status == "invalid_input" and record.end_ns >= record.start_ns


def test_a_common_v1_request_leaves_its_stage_times_not_its_record() -> None:
    feed, observers = monitored()
    end = RequestEnd(observers, "v1", "rest", v1_times)
    record = v1_record()
    assert end.finish(record) is None
    assert feed.records == []
    times = feed.stage_series[("v1", "rest", "cards", "1")]
    assert times.countdown == NEVER - 1 and times.times == v1_times(record)


def test_many_common_v1_requests_are_each_folded_once() -> None:
    """Past ``SPILL_ROWS`` requests their rows are packed into arrays on the request path;
    the fold still counts each request once, with its own stage times."""
    feed, observers = monitored()
    end = RequestEnd(observers, "v1", "rest", v1_times)
    sent = 3 * SPILL_ROWS + 5
    for _ in range(sent):
        end.finish(v1_record())
    times = feed.stage_series[("v1", "rest", "cards", "1")]
    assert times.held() == sent and len(times.times) < times.spill_at
    monitor = feed._monitor  # noqa: SLF001 - the feed's own monitor folds what it holds
    assert monitor.drain() == sent
    monitor.metrics.settle()
    series = monitor.metrics.series[("v1", "cards", "1")]
    assert sum(series.timings["total"].counts) == sent
    assert sum(series.timings["decode"].counts) == sent


def test_an_error_or_a_request_id_hands_the_record_over() -> None:
    feed, observers = monitored()
    end = RequestEnd(observers, "v1", "rest", v1_times)
    failed, named = v1_record(), v1_record(request_id="r1")
    end.finish(failed, "deadline_exceeded")
    end.finish(named)
    assert feed.records == [failed, named] and failed.status == "deadline_exceeded"
    assert all(not t.times for t in feed.stage_series.values())


def test_the_answer_carries_the_trace_a_tracing_observer_names() -> None:
    class Tracer:
        def __init__(self) -> None:
            self.seen: list[RequestRecord] = []

        def request_finished(self, record: RequestRecord) -> None:
            self.seen.append(record)

        def response_traceparent(self, record: RequestRecord) -> str | None:
            return TRACE

    tracer = Tracer()
    typed: TracingObserver = tracer  # held to the protocol by mypy
    end = RequestEnd(Observers([typed]), "v2", "rest")
    record = RequestRecord("v2", "rest")
    assert end.finish(record, end_ns=record.start_ns + 5) == TRACE
    assert tracer.seen == [record] and record.end_ns == record.start_ns + 5


def test_the_monitor_feed_is_a_stage_times_and_tracing_observer() -> None:
    feed, _ = monitored()
    as_stage_times: StageTimesObserver = feed  # mypy checks both protocols
    as_tracing: TracingObserver = feed
    assert as_stage_times is as_tracing


def test_serving_never_imports_monitoring() -> None:
    """The server is assembled above both packages (``redline.assembly``): serving offers
    observers and companions, monitoring attaches to them."""
    code = ("import sys, redline.serving, redline.serving.server, redline.serving.v1_rest, "
            "redline.serving.v1_grpc, redline.serving.warmup\n"
            "bad = sorted(m for m in sys.modules if m.startswith('redline.monitoring'))\n"
            "assert not bad, bad\n"
            "import redline.assembly\n"
            "assert 'redline.monitoring' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def test_build_server_attaches_monitoring_only_when_enabled(tmp_path: object) -> None:
    from redline.assembly import build_server

    on, off = Settings(), Settings()
    off.monitoring.enabled = False
    for settings in (on, off):
        settings.repository = str(tmp_path)
    monitored_server, plain = build_server(on), build_server(off)
    assert isinstance(monitored_server.monitor, ServerMonitor)
    assert monitored_server.companions == [monitored_server.monitor]
    assert monitored_server.monitor.feed in monitored_server.observers
    assert plain.monitor is None and plain.companions == [] and not plain.observers
