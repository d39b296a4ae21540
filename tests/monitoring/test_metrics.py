"""Metric names, labels and values after known traffic; several worker processes; slow log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redline.monitoring.buckets import latency_buckets
from redline.monitoring.metrics import RequestMetrics
from redline.monitoring.prometheus import PrometheusExport
from redline.monitoring.slowlog import SlowLog
from redline.serving.observers import Observers
from tests.monitoring.helpers import record


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_buckets_include_every_objective() -> None:
    b = latency_buckets([100.0, 7.0, 0.3])
    assert 0.007 in b and 0.0003 in b and 0.1 in b and b == sorted(b)


def test_counts_and_histograms_after_known_traffic() -> None:
    buckets = latency_buckets([7.0])
    metrics, export = RequestMetrics(buckets), PrometheusExport(buckets)
    for _ in range(10):
        metrics.request_finished(record(stages={"decode": 10, "inference": 40}))
    for _ in range(3):
        metrics.request_finished(record(stages={"decode": 10, "inference": 9000}))
    metrics.request_finished(record(status="overloaded", path="fallback", stages={"decode": 5}))
    export.flush(metrics)
    export.flush(metrics)  # flushing twice adds nothing
    got = samples(export.render()[0])
    ok = (("api", "v2"), ("model", "m"), ("path", "primary"), ("status", "ok"),
          ("transport", "rest"), ("version", "1"))
    assert got[("redline_requests_total", ok)] == 13
    shed = (("api", "v2"), ("model", "m"), ("path", "fallback"), ("status", "overloaded"),
            ("transport", "rest"), ("version", "1"))
    assert got[("redline_requests_total", shed)] == 1
    inf = (("api", "v2"), ("model", "m"), ("stage", "inference"), ("version", "1"))
    assert got[("redline_stage_duration_seconds_count", inf)] == 13
    # the objective is a bucket boundary: 10 runs of 40 µs within 7 ms, 3 of 9 ms beyond it
    le7 = tuple(sorted((*inf, ("le", "0.007"))))
    assert got[("redline_stage_duration_seconds_bucket", le7)] == 10
    assert abs(got[("redline_stage_duration_seconds_sum", inf)] - (10 * 40e-6 + 3 * 9e-3)) < 1e-9
    total = (("api", "v2"), ("model", "m"), ("version", "1"))
    assert got[("redline_request_duration_seconds_count", total)] == 14


def test_tick_gives_exact_percentiles_and_clears() -> None:
    metrics = RequestMetrics(latency_buckets([]))
    for us in range(1, 101):
        metrics.request_finished(record(stages={"inference": us}))
    tick = metrics.take_tick()[("v2", "m", "1")]
    assert tick["inference"]["n"] == 100
    assert 49 <= tick["inference"]["p50"] <= 51 and 98 <= tick["inference"]["p99"] <= 100
    assert metrics.take_tick() == {}


def test_slow_log_keeps_the_slowest() -> None:
    log = SlowLog(size=3)
    for us in (5, 500, 50, 5000, 1, 700, 2):
        log.request_finished(record(stages={"inference": us}, request_id=f"r{us}"))
    slow = log.slowest()
    assert [s["request_id"] for s in slow] == ["r5000", "r700", "r500"]
    assert slow[0]["stages_us"]["inference"] == 5000


WORKER = """
import sys
from redline.monitoring.metrics import PrometheusExport, RequestMetrics, latency_buckets
from tests.monitoring.helpers import record
b = latency_buckets([5.0])
m, e = RequestMetrics(b), PrometheusExport(b)
for _ in range(int(sys.argv[1])):
    m.request_finished(record(stages={"inference": 40}))
e.flush(m)
e.queue.labels("m", "1").set(int(sys.argv[2]))
import os
print(e.multiprocess, os.getpid())
"""


@pytest.mark.slow
def test_several_worker_processes_add_up(tmp_path: Path) -> None:
    """Two real worker processes write the multiprocess files; one scrape sums them."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(["src", "."])}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(n), str(queue)], env=env,
                                stdout=subprocess.PIPE, text=True, cwd=Path.cwd())
               for n, queue in ((7, 2), (5, 3))]  # two processes at once
    pids = []
    for proc in workers:
        out, _ = proc.communicate(timeout=60)
        flag, pid = out.split()
        assert proc.returncode == 0 and flag == "True"
        pids.append(pid)

    def scrape(*dead: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        out = subprocess.run(
            [sys.executable, "-c",
             "import sys\n"
             "from redline.monitoring.buckets import latency_buckets\n"
             "from redline.monitoring.prometheus import PrometheusExport, worker_exited\n"
             "for pid in sys.argv[1:]: worker_exited(int(pid))\n"
             "sys.stdout.write(PrometheusExport(latency_buckets([5.0])).render()[0].decode())",
             *dead], env=env, capture_output=True, text=True, check=True)
        return samples(out.stdout.encode())

    got = scrape()
    ok = (("api", "v2"), ("model", "m"), ("path", "primary"), ("status", "ok"),
          ("transport", "rest"), ("version", "1"))
    assert got[("redline_requests_total", ok)] == 12
    inf = (("api", "v2"), ("model", "m"), ("stage", "inference"), ("version", "1"))
    assert got[("redline_stage_duration_seconds_count", inf)] == 12
    assert got[("redline_queue_depth", (("model", "m"), ("version", "1")))] == 5
    # the supervisor reports the workers gone: their gauges leave, their counts stay
    got = scrape(*pids)
    assert not any(k[0] == "redline_queue_depth" for k in got)
    assert got[("redline_requests_total", ok)] == 12


def test_observers_call_a_single_observer_directly() -> None:
    """One observer (the monitor's feed): ``finished`` and ``traceparent`` are its own bound
    methods; with several, every one is called and the first traceparent wins."""
    seen: list[tuple[str, object]] = []

    class Plain:
        def request_finished(self, record: object) -> None:
            seen.append(("plain", record))

    class Traced(Plain):
        def request_finished(self, record: object) -> None:
            seen.append(("traced", record))

        def response_traceparent(self, record: object) -> str:
            return "00-tp"

    empty = Observers()
    assert not empty and empty.traceparent(object()) is None  # type: ignore[arg-type]
    one = Observers([Traced()])
    assert one.traceparent(object()) == "00-tp"  # type: ignore[arg-type]
    one.finished("r")  # type: ignore[arg-type]
    assert seen == [("traced", "r")]
    two = Observers([Plain(), Traced()])
    two.finished("s")  # type: ignore[arg-type]
    assert seen[1:] == [("plain", "s"), ("traced", "s")]
    assert two.traceparent(object()) == "00-tp"  # type: ignore[arg-type]


def test_feature_ages_bucketed_at_once_as_observe_would() -> None:
    """The export buckets a tick's feature ages with one ``searchsorted``; the exposed
    histogram is the one ``observe`` per value gives (values on a bound included)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from redline.monitoring.prometheus import observe_all

    ages = [0.0, 0.05, 0.1, 0.1000001, 1.0, 2.5, 7.0, 60.0, 3600.0, 1e9, 0.3, 0.3]
    one = Histogram("age", "a", ["m"], registry=(reg1 := CollectorRegistry()),
                    buckets=(0.1, 0.5, 1.0, 5.0, 60.0, 3600.0))
    many = Histogram("age", "a", ["m"], registry=(reg2 := CollectorRegistry()),
                     buckets=(0.1, 0.5, 1.0, 5.0, 60.0, 3600.0))
    for a in ages:
        one.labels("m").observe(a)
    observe_all(many.labels("m"), ages)
    got, want = samples(generate_latest(reg2)), samples(generate_latest(reg1))
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
