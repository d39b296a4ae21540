"""The monitored V2 gRPC path (timed by clock reads, a record only where one is needed) answers
every message as the unmonitored path does, and still gives a record to every request that
needs one: an id, a caller ``traceparent``, a queued run, the trace head sample."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redline.monitoring import ServerMonitor
from redline.proto import grpc_service_pb2 as pb
from redline.proto import grpc_service_pb2_grpc as pbg
from redline.serving.grpc import lenient
from tests.monitoring.served import (
    in_process_pair,
    make_repository,
    monitored_settings,
    training_data,
)
from tests.monitoring.test_server import grpc_request, metric_samples
from tests.monitoring.test_stage_times import _Spans, read_back
from tests.monitoring.test_stage_times_v1_grpc import (  # noqa: F401 - fed: a fixture
    _Fed,
    fed,
    flushed_tracing,
)
from tests.serving.helpers import ServerThread

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Aborted(Exception):
    pass


class Context:
    """A grpc.aio servicer context as far as ``ModelInfer`` uses it."""

    def __init__(self, metadata: list[tuple[str, str]], remaining: float | None) -> None:
        self.metadata, self.remaining = tuple(metadata), remaining
        self.trailers: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def time_remaining(self) -> float | None:
        return self.remaining

    def set_trailing_metadata(self, trailers: tuple[tuple[str, str], ...]) -> None:
        self.trailers = trailers

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


@pytest.fixture(scope="module")
def servicers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    loop = asyncio.new_event_loop()
    servers = in_process_pair(tmp_path_factory, loop)
    out = {"loop": loop, "off": servers[False].servicer, "on": servers[True].servicer}
    yield out
    loop.close()


floats = st.floats(width=32, allow_nan=True, allow_infinity=True)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    req = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(["fraud", "fraud", "fraud", "nope", ""])),
        model_version=draw(st.sampled_from(["", "", "1", "9", "²"])),
        id=draw(st.sampled_from(["", "", "", "req-1"])))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 2))):
        rows = draw(st.integers(0, 3))
        name = draw(st.sampled_from(["x", "x", "x", "y"]))
        datatype = draw(st.sampled_from(["FP32", "FP32", "FP64", "INT64", "BYTES"]))
        shape = draw(st.sampled_from([[rows, 3], [rows, 3], [rows], [3, rows], [-1, 3]]))
        tensor = req.inputs.add(name=name, datatype=datatype, shape=shape)
        values = draw(st.lists(floats, min_size=rows * 3, max_size=rows * 3 + 1))
        if raw:
            req.raw_input_contents.append(np.asarray(values, np.float32).tobytes())
        elif datatype == "INT64":
            tensor.contents.int64_contents.extend(int(v) for v in values
                                                  if np.isfinite(v) and abs(v) < 2**62)
        else:
            tensor.contents.fp32_contents.extend(values)
    if draw(st.booleans()):
        req.parameters["priority"].string_param = draw(st.sampled_from(["high", "urgent"]))
    if draw(st.booleans()):
        req.outputs.add(name=draw(st.sampled_from(["probabilities", "label", "nope"])))
    return bytes(req.SerializeToString())


metadata = st.lists(st.sampled_from([
    ("x-redline-budget-ms", "5000"), ("x-redline-budget-ms", "-5"),
    ("x-redline-budget-ms", "nan"), ("x-redline-budget-ms", "0.000001"),
    ("x-redline-priority", "high"), ("x-redline-priority", "urgent"),
    ("traceparent", TRACEPARENT), ("traceparent", "garbage"),
]), max_size=3, unique=True)


async def _answer(servicer: Any, message: bytes, md: list[tuple[str, str]],
                  remaining: float | None) -> tuple[Any, ...]:
    request = lenient(pb.ModelInferRequest.FromString, "ModelInferRequest")(message)
    context = Context(md, remaining)
    try:
        response = await servicer.ModelInfer(request, context)
    except Aborted as exc:
        code, details = exc.args
        trailers = tuple(t for t in context.trailers if t[0] != "traceparent")
        return ("aborted", code, details, trailers)
    return ("ok", bytes(response))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=st.one_of(messages(), st.binary(max_size=30)), md=metadata,
       remaining=st.sampled_from([None, None, 30.0, 1e-7]))
def test_monitored_grpc_answers_equal_unmonitored(servicers: dict[str, Any], message: bytes,
                                                  md: list[tuple[str, str]],
                                                  remaining: float | None) -> None:
    loop = servicers["loop"]
    off = loop.run_until_complete(_answer(servicers["off"], message, md, remaining))
    on = loop.run_until_complete(_answer(servicers["on"], message, md, remaining))
    if off[0] == "aborted" and off[1] == grpc.StatusCode.DEADLINE_EXCEEDED:
        assert on[:2] == off[:2]  # the budget ran out: when, in µs, differs between runs
    else:
        assert on == off


def _monitor(server: ServerThread) -> ServerMonitor:
    """The server's monitoring, as the concrete monitor these tests look inside."""
    monitor = server.server.monitor
    assert isinstance(monitor, ServerMonitor)
    return monitor


def _serve(tmp: Path, **batching: Any) -> ServerThread:
    settings = monitored_settings(tick_s=3600.0)
    settings.monitoring.window_rows_per_s = 1.0
    for key, value in batching.items():
        setattr(settings.batching, key, value)
    server = ServerThread(settings, make_repository(tmp))
    _monitor(server).use_trace_exporter(_Spans())  # tracing on: a caller's trace goes on
    return server.start()


def test_queued_grpc_requests_keep_their_records(
        tmp_path: Path, fed: type[_Fed]) -> None:  # noqa: F811 - the fixture
    server = _serve(tmp_path, inline_max_us=0)  # every run is queued: the batcher decides
    rng = np.random.default_rng(5)
    budget = (("x-redline-budget-ms", "5000"),)
    try:
        with httpx.Client(base_url=server.http, timeout=30) as http, \
                grpc.insecure_channel(server.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            before = metric_samples(http.get("/metrics").text)
            fed_before = fed.n
            for _ in range(40):
                stub.ModelInfer(grpc_request(training_data(rng, 1)), timeout=10, metadata=budget)
            queued = fed.n - fed_before
            delta, _ = read_back(http, before)
    finally:
        server.stop()
    assert queued == 40
    base = {"api": "v2", "model": "fraud", "version": "1"}
    assert delta("redline_stage_duration_seconds_count", **base, stage="queue") == 40
    assert delta("redline_requests_total", **base, transport="grpc", path="primary",
                 status="ok") == 40


def test_the_grpc_head_sample_and_its_traces_come_from_the_flat_path(tmp_path: Path) -> None:
    settings = monitored_settings(tick_s=3600.0)
    settings.monitoring.window_rows_per_s = 1.0
    settings.batching.inline_max_us = 1_000_000  # runs at once: the flat path
    settings.monitoring.trace_sample_ratio = 0.2
    server = ServerThread(settings, make_repository(tmp_path))
    _monitor(server).use_trace_exporter(_Spans())
    server.start()
    rng = np.random.default_rng(6)
    named = 0
    try:
        with grpc.insecure_channel(server.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            for _ in range(500):
                _, call = stub.ModelInfer.with_call(
                    grpc_request(training_data(rng, 1)), timeout=10,
                    metadata=(("x-redline-budget-ms", "5000"),))
                tp = dict(call.trailing_metadata()).get("traceparent")
                if tp is not None:
                    assert tp.endswith("-01"), tp  # named only when kept
                    named += 1
            for _ in range(10):  # a caller's trace is continued: a record each
                _, call = stub.ModelInfer.with_call(
                    grpc_request(training_data(rng, 1)), timeout=10,
                    metadata=(("x-redline-budget-ms", "5000"), ("traceparent", TRACEPARENT)))
                tp = dict(call.trailing_metadata()).get("traceparent", "")
                assert tp.split("-")[1:2] == TRACEPARENT.split("-")[1:2], tp
        tracing = flushed_tracing(server)
    finally:
        server.stop()
    # Binomial(500, 0.2): mean 100, sd 8.9; five sd either side
    assert 55 <= named <= 145, named
    assert tracing.kept == named + 10 == tracing.exported


def test_a_grpc_request_in_the_windows_sample_leaves_its_arrays_not_a_record(
        tmp_path: Path, fed: type[_Fed]) -> None:  # noqa: F811 - the fixture
    """Every request in the windows' sample (``window_rows_per_s`` 0), none of them fed as a
    record: the arrays of all 100 reach the drift window at the fold."""
    from tests.monitoring.test_stage_times import _drained

    settings = monitored_settings(tick_s=3600.0)
    settings.monitoring.window_rows_per_s = 0.0
    settings.batching.inline_max_us = 1_000_000  # runs at once: the flat path
    server = ServerThread(settings, make_repository(tmp_path)).start()
    monitor = _monitor(server)
    rng = np.random.default_rng(8)
    budget = (("x-redline-budget-ms", "5000"),)
    try:
        with grpc.insecure_channel(server.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            stub.ModelInfer(grpc_request(training_data(rng, 1)), timeout=10, metadata=budget)
            server.call(_drained(monitor))
            drift = monitor.windows.drift[("fraud", "1")]
            seen = drift.window.rows().shape[0]
            fed_before = fed.n
            for _ in range(100):
                stub.ModelInfer(grpc_request(training_data(rng, 1)), timeout=10, metadata=budget)
            records = fed.n - fed_before
            server.call(_drained(monitor))
            rows = drift.window.rows().shape[0]
    finally:
        server.stop()
    assert records == 0
    assert rows - seen == 100
