"""`redline serve` as a real subprocess: readiness, `redline bench` against it, SIGTERM drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from redline.models import ModelRepository
from tests.conftest import free_port
from tests.logwatch import LoggedPopen
from tests.serving.helpers import affine_model, slow_model

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


@pytest.fixture()
def server_process(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The server with the ``affine`` model and the ``heavy`` one (tens of ms a run)."""
    yield from _serve(tmp_path, heavy=True)


@pytest.fixture()
def light_server_process(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The server with the ``affine`` model only: no seconds of ``heavy`` warm-up for a test
    that never calls it."""
    yield from _serve(tmp_path, heavy=False)


def _serve(tmp_path: Path, heavy: bool):  # type: ignore[no-untyped-def]
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    if heavy:
        repo.add_onnx("heavy", slow_model(layers=400))
    http, grpc_port = free_port(), free_port()
    config = tmp_path / "redline.yaml"
    config.write_text("runtime:\n  warmup_batch_sizes: [1]\n  warmup_runs: 1\n"
                      "batching:\n  max_batch_size: 1\nserver:\n  drain_timeout_s: 20\n")
    proc = LoggedPopen(
        [sys.executable, "-m", "redline.cli", "serve", "--config", str(config), "--repository",
         str(tmp_path / "repo"), "--http-port", str(http), "--grpc-port", str(grpc_port),
         "--no-watch", "--workers", "1"],  # one process: one queue the drain test can watch
        source="redline serve", log=tmp_path / "serve.log",
    )
    url = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            pytest.fail(f"redline serve exited: {proc.log_text()[-3000:]}")
        time.sleep(0.1)
    yield proc, url, f"127.0.0.1:{grpc_port}"
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "redline.cli", "bench", *args],
                          capture_output=True, text=True, timeout=60)


def test_bench_drives_the_server(light_server_process) -> None:  # type: ignore[no-untyped-def]
    _, url, grpc_target = light_server_process
    for extra in (["--url", url], ["--url", url, "--protocol", "binary"],
                  ["--url", grpc_target, "--protocol", "grpc"],
                  ["--url", url, "--rate", "300", "--schedule", "poisson"]):
        launched = time.time()
        done = bench("--model", "affine", "-c", "2", "--duration", "0.5", "--warmup", "0.1",
                     "--json", *extra)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["ok"] > 0 and report["errors"] == {}, report
        # the measured seconds on the wall clock, after the warm-up: what a harness reading
        # the server's CPU time counts (benchmarks/observability/capacity.py)
        start, end = report["window_unix"]
        assert launched + 0.1 <= start < end <= time.time()
        assert end - start == pytest.approx(report["duration_s"], abs=0.01)
        assert 0 < report["latency_ms"]["p50"] <= report["latency_ms"]["p99"]
        assert report["latency_ms"]["p99"] <= report["latency_ms"]["max"]
    done = bench("--model", "affine", "--url", url, "--find-max", "--slo-p99", "50",
                 "--rate", "400", "--duration", "0.2", "--warmup", "0", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["max_rate"] >= 400 and len(found["runs"]) >= 2
    missing = bench("--model", "nope", "--url", url, "--duration", "0.2", "--json")
    assert missing.returncode != 0 and "404" in (missing.stderr + missing.stdout)


def test_sigterm_drains_in_flight_requests_and_exits_0(server_process) -> None:  # type: ignore[no-untyped-def]
    proc, url, grpc_target = server_process
    x = np.ones((1, 384), np.float32)
    body = {"inputs": [{"name": "x", "shape": [1, 384], "datatype": "FP32",
                        "data": x.ravel().tolist()}]}
    results: list[int] = []

    def call() -> None:
        r = httpx.post(f"{url}/v2/models/heavy/infer", json=body, timeout=30,
                       headers={"x-redline-budget-ms": "20000"})
        results.append(r.status_code)

    # imported before the threads start, so the gRPC call is not late to the queue
    import grpc

    from redline.proto import grpc_service_pb2 as pb
    from redline.proto import grpc_service_pb2_grpc as pbg

    def grpc_call() -> None:
        req = pb.ModelInferRequest(model_name="heavy")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 384])
        req.raw_input_contents.append(x.tobytes())
        with grpc.insecure_channel(grpc_target) as channel:
            try:
                pbg.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=20)
                results.append(200)
            except grpc.RpcError as exc:
                results.append(exc.code().value[0])

    threads = [threading.Thread(target=call) for _ in range(3)]
    threads.append(threading.Thread(target=grpc_call))
    for t in threads:
        t.start()
    # Wait until all four are in flight: one running, three queued (max_batch_size 1). A fixed
    # sleep lost this race on a busy shared CPU (SIGTERM came before the clients connected).
    deadline = time.monotonic() + 20
    while True:
        stats = httpx.get(f"{url}/v2/models/heavy/stats", timeout=5).json()
        if stats["queued"] >= 3:
            break
        assert time.monotonic() < deadline and stats["served"] == 0, (
            f"the four requests were never in flight together: {stats}")
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    assert proc.wait(30) == 0, proc.log_text()[-3000:]
    assert results == [200, 200, 200, 200]
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/v2/health/live", timeout=2)


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("busy_port", ["http", "grpc"])
def test_port_in_use_is_one_clear_line(tmp_path: Path, busy_port: str, workers: str) -> None:
    """A port another process listens on is the only line ``redline serve`` prints (exit 2),
    before any model loads (their log lines would come first otherwise), on either port, in
    this process and behind the worker supervisor."""
    import socket

    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = (["--http-port", str(port), "--grpc-port", "0"] if busy_port == "http"
                 else ["--http-port", "0", "--grpc-port", str(port)])
        done = subprocess.run(
            [sys.executable, "-m", "redline.cli", "serve", "--repository", str(tmp_path / "repo"),
             *ports, "--no-watch"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "REDLINE_SCALING__WORKERS": workers})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error [config_invalid]: cannot listen for "
                               f"{busy_port.upper() if busy_port == 'http' else 'gRPC'} on "
                               f"127.0.0.1:{port}")
    assert f"--{busy_port}-port" in lines[0]


def test_one_port_for_http_and_grpc_is_refused(tmp_path: Path) -> None:
    """One port for HTTP and gRPC is a clear configuration error: once gRPC was bound beside
    an HTTP socket that did not listen yet and took a random share of HTTP's connections."""
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    port = free_port()
    for workers in ("1", "2"):  # in this process, and behind the worker supervisor
        done = subprocess.run(
            [sys.executable, "-m", "redline.cli", "serve", "--repository",
             str(tmp_path / "repo"), "--http-port", str(port), "--grpc-port", str(port),
             "--no-watch"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "REDLINE_SCALING__WORKERS": workers})
        assert done.returncode == 2, (workers, done.stderr)
        assert f"127.0.0.1:{port}" in done.stderr and "--grpc-port" in done.stderr
        assert "Traceback" not in done.stderr
