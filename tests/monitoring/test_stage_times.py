"""The common V2 request leaves flat stage times, not a record: the metrics, the slow log and
the trace sample see it all the same, and a record is still made wherever one is needed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import redline.serving.request_end as request_end_module
from redline.config import Settings
from redline.monitoring.buckets import latency_buckets
from redline.monitoring.metrics import RequestMetrics
from redline.monitoring.slowlog import SlowLog
from redline.monitoring.stage_times import NEVER, SPILL_ROWS, StageTimesBuffer, v2_record
from redline.serving.observers import Observers
from redline.serving.stages import RequestRecord
from tests.monitoring.helpers import idle_monitor, record
from tests.monitoring.served import ADMIN_TOKEN, make_repository, monitored_settings, v2_body
from tests.monitoring.test_server import metric_samples
from tests.serving.helpers import ServerThread

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
BUDGET = {"x-redline-budget-ms": "5000"}  # a busy machine's hiccup must not make a 504


class _Counted(RequestRecord):
    """RequestRecord, counted: how many records the V2 path made (``request_end.V2End``)."""

    __slots__ = ()
    made = 0
    lock = threading.Lock()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with _Counted.lock:
            _Counted.made += 1
        super().__init__(*args, **kwargs)


class _Spans:
    """A span sink that keeps what it is sent (encoded OTLP requests)."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def send(self, payload: bytes) -> None:
        self.payloads.append(payload)


def _serve(tmp: Path, ratio: float | None, rows_per_s: float = 1.0) -> ServerThread:
    settings = monitored_settings(tick_s=3600.0)  # no tick: the test decides when to fold
    # Runs happen at once (no queue, which makes a record): the test's client shares the
    # server's process, so a run timed on the loop includes the client's turns with the GIL
    # and the batcher's estimate could otherwise climb past inline_max_us.
    settings.batching.inline_max_us = 1_000_000
    settings.monitoring.window_rows_per_s = rows_per_s  # the windows' sample (0: every request)
    server = ServerThread(settings, make_repository(tmp))
    if ratio is not None:
        settings.monitoring.trace_sample_ratio = ratio
        server.server.monitor.use_trace_exporter(_Spans())
    return server.start()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Counted]]:
    monkeypatch.setattr(request_end_module, "RequestRecord", _Counted)
    _Counted.made = 0
    yield _Counted


def test_common_requests_are_counted_timed_and_slow_logged_without_records(
        tmp_path: Path, counted: type[_Counted]) -> None:
    server = _serve(tmp_path, ratio=None)
    rng = np.random.default_rng(0)
    try:
        with httpx.Client(base_url=server.http, headers=BUDGET, timeout=30) as http:
            # warm: the first request of a version is sampled for the windows
            for _ in range(100):
                http.post("/v2/models/fraud/infer", json=v2_body(rng.normal(size=(1, 3))))
            before = metric_samples(http.get("/metrics").text)
            made_before = counted.made
            for _ in range(300):
                r = http.post("/v2/models/fraud/infer", json=v2_body(rng.normal(size=(1, 3))))
                assert r.status_code == 200 and "traceparent" not in r.headers
            lean_records = counted.made - made_before
            # with an id (a label may come for it) every request is a record
            for i in range(20):
                r = http.post("/v2/models/fraud/infer",
                              json=v2_body(rng.normal(size=(2, 3)), f"id{i}"))
                assert r.status_code == 200
            with_ids = counted.made - made_before - lean_records
            delta, slow = read_back(http, before)
    finally:
        server.stop()

    # The window sample (one a second, and the first request) made the only records.
    assert lean_records <= 4, lean_records
    assert with_ids == 20
    base = {"api": "v2", "model": "fraud", "version": "1"}
    assert delta("redline_requests_total", **base, transport="rest", path="primary",
                 status="ok") == 320
    assert delta("redline_request_duration_seconds_count", **base) == 320
    for stage in ("decode", "inference", "encode"):
        assert delta("redline_stage_duration_seconds_count", **base, stage=stage) == 320
    assert delta("redline_request_rows_bucket", **base, le="1.0") == 300
    assert delta("redline_request_rows_bucket", **base, le="2.0") == 320
    # the slowest of the minute, flat times among them, each with its stages
    assert len(slow) == 20 and slow[0]["total_us"] >= slow[-1]["total_us"]
    assert any(r["request_id"] == "" for r in slow), slow
    for r in slow:
        assert {"decode", "inference", "encode"} <= set(r["stages_us"])
        assert r["total_us"] >= sum(r["stages_us"].values()) - 3  # µs rounded down, per stage


def read_back(http: httpx.Client, before: dict[tuple[str, frozenset], float]
              ) -> tuple[Callable[..., float], list[dict[str, Any]]]:
    """The live server's metrics as ``delta(name, **labels)`` since ``before``, and its slow
    log."""
    got = metric_samples(http.get("/metrics").text)
    slow = http.get("/v1/debug/slow", headers=AUTH).json()["requests"]

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return got.get(key, 0.0) - before.get(key, 0.0)

    return delta, slow


def _named_traces(server: ServerThread, n: int) -> int:
    """How many of ``n`` common requests' answers named a trace (each one kept: ``-01``)."""
    rng = np.random.default_rng(n)
    named = 0
    with httpx.Client(base_url=server.http, headers=BUDGET, timeout=30) as http:
        for _ in range(n):
            r = http.post("/v2/models/fraud/infer", json=v2_body(rng.normal(size=(1, 3))))
            assert r.status_code == 200
            tp = r.headers.get("traceparent")
            if tp is not None:
                assert tp.endswith("-01"), tp  # named only when kept
                named += 1
    return named


def test_the_head_sample_and_its_traces_come_from_the_flat_path(tmp_path: Path) -> None:
    server = _serve(tmp_path, ratio=0.2)
    try:
        named = _named_traces(server, 500)
        tracing = server.server.monitor.tracing
        server.call(_drain(server))
        assert tracing.flush()
    finally:
        server.stop()
    # Binomial(500, 0.2): mean 100, sd 8.9; five sd either side
    assert 55 <= named <= 145, named
    assert tracing.kept == named == tracing.exported


async def _drain(server: ServerThread) -> None:
    server.server.monitor.drain()


def test_the_countdown_samples_each_request_with_the_ratio() -> None:
    times = StageTimesBuffer(sample_ratio=0.01)
    hits = 0
    for _ in range(300_000):
        times.countdown -= 1
        if not times.countdown:
            hits += 1
            times.countdown = times.gap()
    # Binomial(300,000, 0.01): mean 3,000, sd 54.5; five sd either side
    assert 2727 <= hits <= 3273, hits
    assert StageTimesBuffer(sample_ratio=1.0).gap() == 1
    assert StageTimesBuffer(sample_ratio=0.0).countdown == NEVER


def test_spilled_times_are_taken_whole_and_in_order() -> None:
    """The request path packs a buffer's ints every ``SPILL_ROWS`` requests: ``take`` returns
    every request's integers once, in arrival order, whatever was packed and what was not."""
    times = StageTimesBuffer(width=5)
    assert times.spill_at == SPILL_ROWS * 5 and len(times.take()) == 0
    sent: list[int] = []
    for burst in (3 * SPILL_ROWS + 17, SPILL_ROWS, 0, 1):
        for _ in range(burst):
            row = [len(sent) * 10 + k for k in range(5)]
            sent += row
            times.times += row
            if len(times.times) >= times.spill_at:
                times.spill()
        assert len(times.times) < times.spill_at and times.held() * 5 == len(sent)
        got = times.take()
        assert got.dtype == np.int64 and got.tolist() == sent
        assert times.held() == 0 and len(times.take()) == 0
        sent = []


def test_flat_times_fold_into_the_same_metrics_as_their_records() -> None:
    rng = np.random.default_rng(2)
    buckets = latency_buckets([5.0])
    by_records, by_times = RequestMetrics(buckets), RequestMetrics(buckets)
    rows, records = [], []
    for i in range(500):
        decode, inference, encode = (int(v) for v in rng.integers(1, 20_000, 3))
        start = 1_000_000_000 + i * 100_000
        n = int(rng.integers(1, 40))
        rows.append([start, start + decode, start + decode + inference,
                     start + decode + inference + encode, n])
        r = record(stages={}, rows=n, start_ns=start)
        r.spans = [("decode", start, start + decode),
                   ("inference", start + decode, start + decode + inference),
                   ("encode", start + decode + inference, rows[-1][3])]
        r.end_ns = rows[-1][3]
        records.append(r)
    by_records.fold(records)
    by_times.fold_times("v2", "rest", "m", "1", np.asarray(rows[:200], np.int64))
    by_times.fold_times("v2", "rest", "m", "1", np.asarray(rows[200:], np.int64))
    by_records.settle()
    by_times.settle()
    a, b = by_records.series[("v2", "m", "1")], by_times.series[("v2", "m", "1")]
    assert a.requests == b.requests == {("rest", "primary", "ok"): 500}
    assert a.rows == b.rows
    assert set(a.timings) == set(b.timings) == {"decode", "inference", "encode", "total"}
    for stage in a.timings:
        assert a.timings[stage].counts == b.timings[stage].counts, stage
        assert a.timings[stage].sum_ns == b.timings[stage].sum_ns, stage


def test_the_slow_log_takes_the_slowest_flat_times_beside_records() -> None:
    log = SlowLog(size=3)
    log.request_finished(record(stages={"inference": 700}, request_id="r700"))
    flat = np.asarray([[0, 10_000, 20_000 + us * 1000, 30_000 + us * 1000, 1]
                       for us in (5, 5000, 1, 900, 2, 600)], np.int64)
    log.fold_times(flat, flat[:, 3] - flat[:, 0], partial(v2_record, "rest", "m", "1"))
    slow = log.slowest()
    assert [s["request_id"] for s in slow] == ["", "", "r700"]
    assert [round(s["total_us"]) for s in slow] == [5030, 930, 702]
    assert slow[0]["stages_us"] == {"decode": 10, "inference": 5010, "encode": 10}


def test_a_slow_graph_rows_entry_shows_the_steps_it_ran() -> None:
    """A graph's row: the V2 fields, then each step's ns (-1: not run); its slow-log entry
    lays the steps it ran end to end from the decode."""
    steps = ("step:pre", "step:cheap", "step:sure")
    row = [0, 10_000, 90_000, 100_000, 2, 30_000, 20_000, -1]
    entry = v2_record("rest", "g", "1", row, steps=steps)
    assert entry.spans == [("decode", 0, 10_000), ("step:pre", 10_000, 40_000),
                           ("step:cheap", 40_000, 60_000), ("inference", 10_000, 90_000),
                           ("encode", 90_000, 100_000)]
    assert entry.timings_us()["total"] == 100
    # its buffer packs every SPILL_ROWS requests, as a model's does, whatever the row's width
    buffer = StageTimesBuffer(steps=steps)
    assert buffer.width == 8 and buffer.spill_at == SPILL_ROWS * 8


def test_only_a_lone_observer_that_keeps_stage_times_gets_them() -> None:
    class Plain:
        def request_finished(self, record: object) -> None:
            pass

    class Keeps(Plain):
        def stage_times(self, api: str, transport: str, model: str, version: str,
                        steps: tuple[str, ...] = ()) -> StageTimesBuffer:
            return StageTimesBuffer(steps=steps)

    assert Observers().stage_times is None
    assert Observers([Plain()]).stage_times is None
    assert Observers([Keeps()]).stage_times is not None
    # a second observer (a rollout's) must see every request: records for all again
    keeps, plain = Keeps(), Plain()
    both = Observers([keeps])
    both.add(plain)
    assert both.stage_times is None and plain in both
    both.remove(plain)  # the rollout ended: the lone observer gets them again
    assert both.stage_times is not None and plain not in both and keeps in both
    assert both.finished == keeps.request_finished
    both.remove(keeps)
    assert not both and both.stage_times is None


def test_a_record_made_for_the_windows_is_not_drawn_into_the_trace_sample_twice(
        tmp_path: Path) -> None:
    """Every request sampled for the windows gets a record; its place in the trace head sample
    is the countdown's draw, not a second one (which would double its chance)."""
    server = _serve(tmp_path, ratio=0.1, rows_per_s=0)  # every request in the windows' sample
    try:
        named = _named_traces(server, 1000)
    finally:
        server.stop()
    # Binomial(1000, 0.1): mean 100, sd 9.5; drawn twice the rate would be ~0.19 (mean 190)
    assert 55 <= named <= 145, named


def test_a_v2_request_in_the_windows_sample_leaves_its_arrays_not_a_record(
        tmp_path: Path, counted: type[_Counted]) -> None:
    """With every request in the windows' sample (``window_rows_per_s`` 0), common V2 REST
    requests still make no record: their arrays go beside their stage times, and every one of
    them reaches the drift window at the fold."""
    server = _serve(tmp_path, ratio=None, rows_per_s=0.0)
    rng = np.random.default_rng(1)
    monitor = server.server.monitor
    try:
        with httpx.Client(base_url=server.http, headers=BUDGET, timeout=30) as http:
            assert http.post("/v2/models/fraud/infer",
                             json=v2_body(rng.normal(size=(1, 3)))).status_code == 200
            server.call(_drained(monitor))
            drift = monitor.windows.drift[("fraud", "1")]
            seen = drift.window.rows().shape[0]
            made_before = counted.made
            for _ in range(200):
                r = http.post("/v2/models/fraud/infer", json=v2_body(rng.normal(size=(1, 3))))
                assert r.status_code == 200
            made = counted.made - made_before
            server.call(_drained(monitor))
            rows = drift.window.rows().shape[0]
    finally:
        server.stop()
    assert made == 0
    assert rows - seen == 200


async def _drained(monitor: Any) -> None:
    """The tick's fold of what the feed holds, then the windows take it (on their thread)."""
    import asyncio

    monitor.drain()
    await asyncio.to_thread(monitor.windows.absorb)


def test_requests_that_arrive_while_the_tick_folds_are_counted_once() -> None:
    """The tick takes the flat stage times there at its start and folds them in slices,
    letting the loop serve between them; what arrives meanwhile (and a scrape's fold in
    between) is neither lost nor counted twice."""
    import asyncio

    from redline.config import Settings
    from redline.monitoring.monitor import TIMES_SLICE
    from tests.monitoring.helpers import idle_monitor

    monitor = idle_monitor(Settings())
    times = monitor.feed.stage_times("v2", "rest", "m", "1")
    sent = 0

    def arrive(n: int) -> None:
        nonlocal sent
        for _ in range(n):
            start = 1_000_000_000 + sent * 1000
            times.times += (start, start + 10, start + 20, start + 30, 1)
            if len(times.times) >= times.spill_at:  # as the request path does
                times.spill()
            sent += 1

    async def serve_meanwhile() -> None:
        for turn in range(20):  # the loop's other work between the tick's slices
            arrive(137)
            if turn == 7:
                monitor.drain()  # a scrape between two slices
            await asyncio.sleep(0)

    async def main() -> None:
        arrive(3 * TIMES_SLICE + 11)
        await asyncio.gather(monitor.drain_in_slices(), serve_meanwhile())
        monitor.drain()

    asyncio.run(main())
    monitor.metrics.settle()
    series = monitor.metrics.series[("v2", "m", "1")]
    assert series.requests == {("rest", "primary", "ok"): sent}
    assert sum(series.timings["total"].counts) == sent
    assert sum(series.rows) == sent


class _Version:
    """What ``V2End`` reads of a model version (``request_end.VersionRef``)."""

    key = ("m", "1")
    shadowed = False
    keep_io = True
    io_next_ns = NEVER

    def sample_due(self, t0: int) -> bool:
        return False

    def keep_io_on(self, record: RequestRecord, inputs: Any, outputs: Any, t0: int) -> None:
        pass


def test_every_v2_request_is_counted_once_flat_or_as_a_record() -> None:
    """The V2 end's draw (the head sample, slow requests) and its series: through draws,
    slow requests and a rollout's observer coming and going, each request
    leaves exactly one row or one record, and the sample keeps the ratio's share."""
    settings = Settings()
    settings.monitoring.trace_sample_ratio = 0.0
    monitor = idle_monitor(settings)
    observers = Observers([monitor.feed])
    end = request_end_module.V2End(observers, "rest")
    times = monitor.feed.stage_times("v2", "rest", "m", "1")
    times.retune(slow_ns=50_000, sample_ratio=0.25)
    version = _Version()

    class Rollout:
        def __init__(self) -> None:
            self.seen: list[RequestRecord] = []

        def request_finished(self, record: RequestRecord) -> None:
            self.seen.append(record)

    rollout = Rollout()
    records: list[RequestRecord] = []  # every record the feed folds
    fold = monitor.fold

    def kept(batch: list[Any]) -> None:
        records.extend(batch)
        fold(batch)

    monitor.fold = kept  # type: ignore[method-assign,assignment]
    for i in range(4000):
        if i == 1500:
            observers.add(rollout)  # every request needs its record while it observes
        if i == 2500:
            observers.remove(rollout)
        start = 1_000_000 * i
        end.answered(version, "", None, 1, None, None, start, start + 1000, start + 2000,
                     start + (60_000 if i % 97 == 0 else 3000))  # one in 97 slow
    flat = times.held()
    monitor.drain()
    monitor.metrics.settle()
    series = monitor.metrics.series[("v2", "m", "1")]
    assert series.requests == {("rest", "primary", "ok"): 4000}
    assert sum(series.timings["total"].counts) == 4000
    assert flat + len(records) == 4000 and len({id(r) for r in records}) == len(records)
    assert len(rollout.seen) == 1000  # each request while it observed, once
    seen = {id(r) for r in rollout.seen}
    assert seen <= {id(r) for r in records}
    own = [r for r in records if id(r) not in seen]
    slow = sum(1 for i in [*range(1500), *range(2500, 4000)] if i % 97 == 0)
    assert sum(1 for r in own if r.end_ns - r.start_ns > 50_000) == slow
    drawn = sum(1 for r in own if r.trace_keep and r.end_ns - r.start_ns <= 50_000)
    # the head sample among the 3,000 requests of the flat path: about a quarter of them
    # (a slow one takes a draw too); Binomial(~2970, 0.25): mean ~742, sd 23.6, five sd
    assert 624 <= drawn <= 860, drawn
    assert all(r.trace_keep is not None for r in own)
