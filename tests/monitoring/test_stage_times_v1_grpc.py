"""The common ``/v1`` REST and V2 gRPC requests leave flat stage times and their records are
dropped: the metrics, the slow log and the trace sample see them all the same, a ``/v1`` answer
keeps its ``timings_us``, and a record still reaches the monitor wherever one is needed (a
request id, the windows' sample, a trace)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from redline.monitoring.buckets import latency_buckets
from redline.monitoring.metrics import RequestMetrics
from redline.monitoring.monitor import RecordFeed
from redline.monitoring.slowlog import SlowLog
from redline.monitoring.stage_times import v1_record
from redline.proto import grpc_service_pb2_grpc as pbg
from redline.proto import redline_v1_pb2 as v1
from redline.proto import redline_v1_pb2_grpc as v1g
from redline.serving.stages import RequestRecord, v1_times
from tests.monitoring.served import ADMIN_TOKEN, make_repository, monitored_settings, training_data
from tests.monitoring.test_server import grpc_request, metric_samples
from tests.monitoring.test_stage_times import _Spans, read_back
from tests.serving.helpers import ServerThread

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
BUDGET = {"x-redline-budget-ms": "5000"}  # a busy machine's hiccup must not make a 504
PREDICT = "/v1/models/fraud/predict"


class _Fed:
    """How many records reached the monitor's feed."""

    n = 0
    lock = threading.Lock()


@pytest.fixture
def fed(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Fed]]:
    feed_one = RecordFeed.request_finished

    def counting(self: RecordFeed, record: Any) -> None:
        with _Fed.lock:
            _Fed.n += 1
        feed_one(self, record)

    monkeypatch.setattr(RecordFeed, "request_finished", counting)  # before a server binds it
    _Fed.n = 0
    yield _Fed


def _serve(tmp: Path, ratio: float | None = None, rows_per_s: float = 1.0) -> ServerThread:
    settings = monitored_settings(tick_s=3600.0)  # no tick: the test decides when to fold
    # Runs happen at once (no queue, which makes a record): the test's client shares the
    # server's process, so a run timed on the loop includes the client's turns with the GIL
    # and the batcher's estimate could otherwise climb past inline_max_us.
    settings.batching.inline_max_us = 1_000_000
    settings.monitoring.window_rows_per_s = rows_per_s
    server = ServerThread(settings, make_repository(tmp))
    if ratio is not None:
        settings.monitoring.trace_sample_ratio = ratio
        server.server.monitor.use_trace_exporter(_Spans())
    return server.start()


def _body(rng: np.random.Generator, request_id: str | None = None) -> dict[str, Any]:
    x = rng.normal(size=3)
    body: dict[str, Any] = {"request": {"amount": float(x[0]), "age": float(x[1]),
                                        "channel": int(abs(x[2]) * 2) % 3}}
    if request_id is not None:
        body["request_id"] = request_id
    return body


def test_common_v1_requests_are_counted_timed_and_slow_logged_without_records(
        tmp_path: Path, fed: type[_Fed]) -> None:
    server = _serve(tmp_path)
    rng = np.random.default_rng(0)
    try:
        with httpx.Client(base_url=server.http, headers=BUDGET, timeout=30) as http:
            # warm: the first request of a version is sampled for the windows
            for _ in range(100):
                http.post(PREDICT, json=_body(rng))
            before = metric_samples(http.get("/metrics").text)
            fed_before = fed.n
            for _ in range(300):
                r = http.post(PREDICT, json=_body(rng))
                assert r.status_code == 200 and "traceparent" not in r.headers
                timings = r.json()["timings_us"]
                assert {"decode", "features", "admission", "inference", "total"} <= set(timings)
            common_fed = fed.n - fed_before
            # with an id (a label may come for it) every request's record is kept
            for i in range(20):
                assert http.post(PREDICT, json=_body(rng, f"id{i}")).status_code == 200
            with_ids = fed.n - fed_before - common_fed
            delta, slow = read_back(http, before)
    finally:
        server.stop()

    # The windows' sample (one a second, and the first request) kept the only records.
    assert common_fed <= 4, common_fed
    assert with_ids == 20
    base = {"api": "v1", "model": "fraud", "version": "1"}
    assert delta("redline_requests_total", **base, transport="rest", path="primary",
                 status="ok") == 320
    assert delta("redline_request_duration_seconds_count", **base) == 320
    for stage in ("decode", "features", "admission", "inference"):  # one value a request
        assert delta("redline_stage_duration_seconds_count", **base, stage=stage) == 320
    assert delta("redline_request_rows_bucket", **base, le="1.0") == 320
    v1_slow = [r for r in slow if r["api"] == "v1"]
    assert len(v1_slow) == 20 and any(r["request_id"] == "" for r in v1_slow), slow
    for r in v1_slow:
        assert {"decode", "features", "admission", "inference"} <= set(r["stages_us"])
        assert r["total_us"] >= sum(r["stages_us"].values()) - 4  # µs rounded down, per stage


def test_v1_requests_in_the_windows_sample_reach_the_windows_without_records(
        tmp_path: Path, fed: type[_Fed]) -> None:
    """A request sampled for the drift/quality windows leaves its arrays beside its flat row:
    the windows see every one of them, the monitor's feed gets no record (it got one each)."""
    server = _serve(tmp_path, rows_per_s=1_000_000.0)  # every request is in the sample
    rng = np.random.default_rng(5)
    try:
        with httpx.Client(base_url=server.http, headers=BUDGET, timeout=30) as http:
            seen_before = http.get("/v1/models/fraud/drift").json()["versions"][0]["window"]
            fed_before = fed.n
            for _ in range(300):
                assert http.post(PREDICT, json=_body(rng)).status_code == 200
            common_fed = fed.n - fed_before
            window = http.get("/v1/models/fraud/drift").json()["versions"][0]["window"]
            before = metric_samples(http.get("/metrics").text)
            assert http.post(PREDICT, json=_body(rng)).status_code == 200
            delta, _ = read_back(http, before)
    finally:
        server.stop()
    assert common_fed <= 2, common_fed
    assert window["seen"] - seen_before["seen"] == 300, (seen_before, window)
    assert delta("redline_requests_total", api="v1", model="fraud", version="1",
                 transport="rest", path="primary", status="ok") == 1  # counted from its row


def test_the_v1_head_sample_and_its_traces_come_from_the_flat_path(tmp_path: Path) -> None:
    server = _serve(tmp_path, ratio=0.2)
    rng = np.random.default_rng(1)
    named = 0
    try:
        with httpx.Client(base_url=server.http, headers=BUDGET, timeout=30) as http:
            for _ in range(500):
                r = http.post(PREDICT, json=_body(rng))
                assert r.status_code == 200
                tp = r.headers.get("traceparent")
                if tp is not None:
                    assert tp.endswith("-01"), tp  # named only when kept
                    named += 1
        tracing = flushed_tracing(server)
    finally:
        server.stop()
    # Binomial(500, 0.2): mean 100, sd 8.9; five sd either side
    assert 55 <= named <= 145, named
    assert tracing.kept == named == tracing.exported


def flushed_tracing(server: ServerThread) -> Any:
    """The server's tracing once every request is folded and every kept trace exported."""
    tracing = server.server.monitor.tracing

    async def drain() -> None:
        server.server.monitor.drain()

    server.call(drain())
    assert tracing.flush()
    return tracing


def _v1_record(rng: np.random.Generator, start: int, path: str) -> RequestRecord:
    """A finished /v1 record as the pipeline makes one: features passed twice."""
    r = RequestRecord("v1", "rest", start)
    r.model, r.version, r.path = "m", "1", path
    r.rows = int(rng.integers(1, 40))
    t = start
    stages = ["decode", "features", "admission", "features", "inference"]
    if rng.random() < 0.3:
        stages.insert(2, "sessions")
    if rng.random() < 0.3:
        stages.insert(-1, "queue")
    for stage in stages:
        d = int(rng.integers(1, 20_000))
        r.add(stage, t, t + d)
        t += d
    if rng.random() < 0.5:
        r.attributes = {"feature_age_s": float(rng.uniform(0, 100))}
    r.finish(end_ns=t + int(rng.integers(0, 5_000)))
    return r


def test_flat_v1_rows_fold_into_the_same_metrics_as_their_records() -> None:
    rng = np.random.default_rng(2)
    buckets = latency_buckets([5.0])
    by_records, by_times = RequestMetrics(buckets), RequestMetrics(buckets)
    paths = ["primary", "fallback", "cache", "default"]
    records = [_v1_record(rng, 10**9 + i * 100_000, paths[i % 4]) for i in range(500)]
    rows = np.asarray([v1_times(r) for r in records], np.int64)
    by_records.fold(records)
    by_times.fold_v1_times("rest", "m", "1", rows[:200])
    by_times.fold_v1_times("rest", "m", "1", rows[200:])
    by_records.settle()
    by_times.settle()
    a, b = by_records.series[("v1", "m", "1")], by_times.series[("v1", "m", "1")]
    assert a.requests == b.requests == {("rest", p, "ok"): 125 for p in paths}
    assert a.rows == b.rows
    assert set(a.timings) == set(b.timings) == {
        "decode", "features", "sessions", "admission", "queue", "inference", "total"}
    for stage in a.timings:
        assert a.timings[stage].counts == b.timings[stage].counts, stage
        assert a.timings[stage].sum_ns == b.timings[stage].sum_ns, stage
    assert sum(a.timings["features"].counts) == 500  # passed twice: one value a request
    assert a.feature_age == pytest.approx(b.feature_age, abs=1e-9)
    assert len(a.feature_age) > 200


def test_a_v1_row_keeps_what_the_record_said() -> None:
    rng = np.random.default_rng(3)
    r = _v1_record(rng, 5_000_000, "fallback")
    row = v1_times(r)
    flat = v1_record("rest", "m", "1", row)
    assert (flat.api, flat.path, flat.rows, flat.status) == ("v1", "fallback", r.rows, "ok")
    ours, theirs = flat.timings_us(), r.timings_us()
    assert ours.keys() == theirs.keys()  # features once, summed, in both
    assert all(abs(ours[k] - theirs[k]) <= 1 for k in ours), (ours, theirs)  # µs rounding
    log = SlowLog(size=2)
    rows = np.asarray([row, v1_times(_v1_record(rng, 9_000_000, "primary"))], np.int64)
    log.fold_times(rows, rows[:, 1] - rows[:, 0], partial(v1_record, "rest", "m", "1"))
    assert {s["path"] for s in log.slowest()} == {"fallback", "primary"}


def test_common_grpc_requests_both_apis_are_counted_and_timed_without_records(
        tmp_path: Path, fed: type[_Fed]) -> None:
    server = _serve(tmp_path)
    rng = np.random.default_rng(4)
    try:
        with httpx.Client(base_url=server.http, timeout=30) as http, \
                grpc.insecure_channel(server.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            budget = (("x-redline-budget-ms", "5000"),)
            for _ in range(20):  # warm: the first request of a version is sampled
                stub.ModelInfer(grpc_request(training_data(rng, 1)), timeout=10, metadata=budget)
            before = metric_samples(http.get("/metrics").text)
            fed_before = fed.n
            for _ in range(300):
                stub.ModelInfer(grpc_request(training_data(rng, 1)), timeout=10, metadata=budget)
            predict = v1g.PredictionServiceStub(channel).Predict
            for _ in range(100):  # /v1 over gRPC: the same
                answer = predict(v1.PredictRequest(model_name="fraud", instances=[
                    v1.Instance(request=_body(rng)["request"])]), timeout=10, metadata=budget)
                assert answer.path == "primary"
            common_fed = fed.n - fed_before
            for i in range(20):  # with an id: a record each, as before
                stub.ModelInfer(grpc_request(training_data(rng, 2), f"g{i}"), timeout=10,
                                metadata=budget)
            with_ids = fed.n - fed_before - common_fed
            delta, slow = read_back(http, before)
    finally:
        server.stop()

    assert common_fed <= 6, common_fed  # the windows' sample, one a second and version
    assert with_ids == 20
    base = {"api": "v2", "model": "fraud", "version": "1"}
    assert delta("redline_requests_total", **base, transport="grpc", path="primary",
                 status="ok") == 320
    for stage in ("decode", "inference", "encode"):
        assert delta("redline_stage_duration_seconds_count", **base, stage=stage) == 320
    assert delta("redline_request_rows_bucket", **base, le="1.0") == 300
    assert delta("redline_requests_total", api="v1", model="fraud", version="1",
                 transport="grpc", path="primary", status="ok") == 100
    grpc_slow = [r for r in slow if r["transport"] == "grpc"]
    assert len(grpc_slow) == 20 and any(r["request_id"] == "" for r in grpc_slow), slow
