"""The autoscaler: its decision function through a surge and a lull, then one real surge."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from redline.models import ModelRepository
from redline.scaling.autoscaler import Autoscaler, LoadSample, ScalePolicy, decide
from tests.scaling.models import slow_affine
from tests.scaling.procs import CONFIG, Serve, SteadyLoad

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

POLICY = ScalePolicy(min_workers=1, max_workers=4, objective_p99_ms=10, queue_high=4,
                     queue_low=0.5, up_cooldown_s=5, down_cooldown_s=30)


def test_surge_then_lull_tick_by_tick() -> None:
    scaler = Autoscaler(POLICY)
    workers = 1
    trace = []
    # (second, in flight, p99 ms): quiet, a surge of 20 in flight, then a lull.
    timeline = [(0, 0.2, 2.0), (1, 20, 30.0), (2, 20, 30.0), (6, 18, 25.0), (12, 6, 9.0),
                (20, 0.1, 2.0), (40, 0.1, 2.0), (50, 0.1, 2.0), (75, 0.1, 2.0), (110, 0.1, 2.0)]
    for t, flying, p99 in timeline:
        decision = scaler.tick(LoadSample(workers, flying, p99), now=float(t))
        workers = decision.target
        trace.append(workers)
    # Up at once to enough workers for the queue (20 / 4 = 5, capped at 4); held during the
    # cool-down; then down one at a time, 30 s apart, to the minimum - never below it.
    assert trace == [1, 4, 4, 4, 4, 4, 3, 3, 2, 1]
    assert scaler.counts == {"up": 1, "down": 3, "hold": 6}
    assert [h[3].split(":")[0] for h in scaler.history] == ["up", "down", "down", "down"]


def test_latency_alone_scales_up_and_bounds_hold() -> None:
    slow = decide(POLICY, LoadSample(2, 1.0, 25.0), now=100.0, last_change=0.0)
    assert slow.target == 3 and "p99" in slow.reason
    at_max = decide(POLICY, LoadSample(4, 100.0, 50.0), now=100.0, last_change=0.0)
    assert at_max.target == 4  # never past the maximum, however loaded
    cooling = decide(POLICY, LoadSample(2, 30.0, 50.0), now=3.0, last_change=0.0)
    assert cooling.target == 2 and cooling.reason.startswith("hold")
    busy_but_fast = decide(POLICY, LoadSample(2, 3.0, 1.0), now=100.0, last_change=0.0)
    assert busy_but_fast.target == 2  # between the marks: no flapping


def surge_config(scale_down_cooldown_s: float) -> str:
    """Scale 1..2 workers on a queue of one request, quickly up, down after the cool-down."""
    return CONFIG + ("scaling:\n  min_workers: 1\n  max_workers: 2\n  queue_high: 1.0\n"
                     "  queue_low: 0.5\n  autoscale_interval_s: 0.2\n"
                     "  scale_up_cooldown_s: 0.5\n"
                     f"  scale_down_cooldown_s: {scale_down_cooldown_s}\n")


def wait_for_log(serve: Serve, line: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in serve.log.read_text():
        assert time.monotonic() < deadline, serve.log.read_text()[-2000:]
        time.sleep(0.1)


def test_a_real_surge_adds_a_worker_and_the_lull_removes_it(tmp_path: Path) -> None:
    ModelRepository(tmp_path / "repo").add_onnx("affine", slow_affine(layers=60))
    config = surge_config(scale_down_cooldown_s=1.5)
    serve = Serve(tmp_path, "--workers", "1", config=config).wait_ready()
    try:
        serve.wait_children(1)
        with SteadyLoad(serve.url, threads=8, seconds=20, pause_s=0.0) as load:
            wait_for_log(serve, "autoscale 1 -> 2")
            serve.wait_children(2)
            result = load.stop()
        assert result.failed == 0, result.errors[:5]
        wait_for_log(serve, "autoscale 2 -> 1")
        serve.wait_children(1)  # the retired worker drained and exited; none replaced it
        log = serve.log.read_text()
        assert re.search(r"autoscale 1 -> 2 workers: up: queue", log)
        assert "restarting" not in log  # a retirement is not a crash
    finally:
        assert serve.stop() == 0


def test_a_grpc_surge_adds_a_worker(tmp_path: Path) -> None:
    """The same surge over gRPC (V2 ModelInfer) alone: the workers meter gRPC too."""
    import threading

    import grpc
    import numpy as np

    from redline.proto import grpc_service_pb2 as pb
    from redline.proto import grpc_service_pb2_grpc as pbg

    ModelRepository(tmp_path / "repo").add_onnx("affine", slow_affine(layers=60))
    config = surge_config(scale_down_cooldown_s=60)
    serve = Serve(tmp_path, "--workers", "1", config=config).wait_ready()
    stop = threading.Event()
    answered: list[int] = []
    errors: list[str] = []

    def load() -> None:
        channel = grpc.insecure_channel(serve.grpc)
        stub = pbg.GRPCInferenceServiceStub(channel)
        req = pb.ModelInferRequest(model_name="affine")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        req.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
        deadline = time.monotonic() + 20
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                stub.ModelInfer(req, timeout=10)
                answered.append(1)
            except grpc.RpcError as exc:
                errors.append(repr(exc))
        channel.close()

    threads = [threading.Thread(target=load) for _ in range(8)]
    try:
        serve.wait_children(1)
        for t in threads:
            t.start()
        wait_for_log(serve, "autoscale 1 -> 2")
        serve.wait_children(2)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        assert serve.stop() == 0
    assert re.search(r"autoscale 1 -> 2 workers: up: (queue|p99)", serve.log.read_text())
    assert answered and not errors, errors[:3]
