"""Hot swaps under load, failed loads that keep the old version, version policy, aliases."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from redline.config import Settings
from redline.models import ModelRepository, VersionPolicy
from redline.proto import grpc_service_pb2 as pb
from redline.proto import grpc_service_pb2_grpc as pbg
from tests.serving.helpers import ServerThread, affine_model, slow_model


def settings(watch: bool = False) -> Settings:
    s = Settings()
    s.runtime.warmup_batch_sizes = [1]
    s.runtime.warmup_runs = 1
    s.server.watch_repository = watch
    s.server.watch_interval_s = 0.05
    s.server.drain_timeout_s = 5
    return s


def body(x: np.ndarray) -> dict:  # type: ignore[type-arg]
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}


def broken_at_run_model() -> bytes:
    """Valid ONNX that loads, but fails on every run (reshape of 4 values into 3): warm-up fails."""
    shape = numpy_helper.from_array(np.array([-1, 3], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]),
         helper.make_node("ReduceSum", ["r"], ["s"], keepdims=0)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_hot_swap_under_continuous_load_has_no_failures(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    repo.add_onnx("m", affine_model(scale=1.0))
    server = ServerThread(settings(watch=True), repo).start()
    stop = threading.Event()
    failures: list[str] = []
    seen: list[list[str]] = [[], []]
    x = np.ones((1, 4), np.float32)

    def rest_client() -> None:
        with httpx.Client(base_url=server.http, timeout=10) as client:
            while not stop.is_set():
                r = client.post("/v2/models/m/infer", json=body(x))
                if r.status_code != 200:
                    failures.append(r.text)
                    continue
                doc = r.json()
                version = doc["model_version"]
                y = doc["outputs"][0]["data"]
                if y != [float(version)] * 4:  # version v multiplies by v
                    failures.append(f"v{version} answered {y}")
                seen[0].append(version)

    def grpc_client() -> None:
        with grpc.insecure_channel(server.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            req = pb.ModelInferRequest(model_name="m")
            req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
            req.raw_input_contents.append(x.tobytes())
            while not stop.is_set():
                try:
                    resp = stub.ModelInfer(req, timeout=10)
                except grpc.RpcError as exc:
                    failures.append(str(exc))
                    continue
                seen[1].append(resp.model_version)

    threads = [threading.Thread(target=rest_client), threading.Thread(target=grpc_client)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.3)
        repo.add_onnx("m", affine_model(scale=2.0))  # the watcher loads, warms, swaps
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (seen[0][-1:] == ["2"] and seen[1][-1:] == ["2"]):
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        server.stop()
    assert not failures, failures[:3]
    for versions in seen:
        assert versions[0] == "1" and versions[-1] == "2", Counter(versions)
        first_two = versions.index("2")
        assert set(versions[first_two:]) == {"2"}, "a request went back to the old version"


@pytest.mark.slow
def test_in_flight_requests_finish_on_their_version(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    repo.add_onnx("s", slow_model(layers=300))
    server = ServerThread(settings(), repo).start()
    try:
        x = np.ones((1, 384), np.float32)
        result: dict[str, httpx.Response] = {}

        def slow_call() -> None:
            result["r"] = httpx.post(f"{server.http}/v2/models/s/infer", json=body(x), timeout=30)

        worker = threading.Thread(target=slow_call)
        worker.start()
        # Wait until the slow request is running on version 1 (a fixed sleep lost this race on
        # a busy shared CPU: the request then arrived after the swap).
        batcher = server.server.registry.get("s").batcher
        deadline = time.monotonic() + 20
        while batcher.idle and time.monotonic() < deadline:
            time.sleep(0.002)
        repo.add_onnx("s", slow_model(layers=1))
        server.call(server.server.registry.sync())
        after = httpx.post(f"{server.http}/v2/models/s/infer", json=body(x), timeout=30)
        worker.join(30)
        assert result["r"].status_code == 200 and result["r"].json()["model_version"] == "1"
        assert after.status_code == 200 and after.json()["model_version"] == "2"
    finally:
        server.stop()


def test_failed_load_keeps_the_old_version_and_says_why(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    repo.add_onnx("m", affine_model(scale=1.0))
    s = settings()
    s.server.admin_enabled = True
    s.server.admin_token = "t"
    server = ServerThread(s, repo).start()
    try:
        repo.add_onnx("m", broken_at_run_model())
        server.call(server.server.registry.sync())
        x = np.ones((1, 4), np.float32)
        r = httpx.post(f"{server.http}/v2/models/m/infer", json=body(x), timeout=10)
        assert r.status_code == 200 and r.json()["model_version"] == "1"
        index = httpx.post(f"{server.http}/v2/repository/index",
                           headers={"Authorization": "Bearer t"}, timeout=10).json()
        v2 = next(row for row in index if row["version"] == "2")
        assert v2["state"] == "UNAVAILABLE" and "reshape" in v2["reason"].lower()
        r = httpx.post(f"{server.http}/v2/models/m/versions/2/infer", json=body(x), timeout=10)
        assert r.status_code == 503 and "failed to load" in r.json()["error"]
        # A corrupted file (sha256 mismatch) is refused the same way.
        repo.add_onnx("m", affine_model(scale=3.0))
        path = repo.version_dir("m", 3) / "model.onnx"
        path.write_bytes(path.read_bytes()[:-10])
        server.call(server.server.registry.sync())
        r = httpx.post(f"{server.http}/v2/models/m/infer", json=body(x), timeout=10)
        assert r.json()["model_version"] == "1"
        assert "sha256" in server.server.registry.failures[("m", 3)]
        assert httpx.get(f"{server.http}/v2/health/ready", timeout=10).status_code == 200
    finally:
        server.stop()


def test_version_policy_and_aliases(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    for scale in (1.0, 2.0, 3.0):
        repo.add_onnx("m", affine_model(scale=scale))
    repo.set_policy("m", VersionPolicy.latest(2))
    server = ServerThread(settings(), repo).start()
    x = np.ones((1, 4), np.float32)

    def version_of(path: str) -> tuple[int, str]:
        r = httpx.post(f"{server.http}{path}", json=body(x), timeout=10)
        return r.status_code, r.json().get("model_version") or r.json()["error"]

    try:
        assert version_of("/v2/models/m/infer") == (200, "3")
        assert version_of("/v2/models/m/versions/2/infer") == (200, "2")
        status, message = version_of("/v2/models/m/versions/1/infer")
        assert status == 503 and "not loaded" in message
        repo.promote("m", 1)  # an alias target is always live, and becomes the default
        server.call(server.server.registry.sync())
        assert version_of("/v2/models/m/infer") == (200, "1")
        assert version_of("/v2/models/m/versions/production/infer") == (200, "1")
        assert version_of("/v2/models/m/versions/3/infer") == (200, "3")
        meta = httpx.get(f"{server.http}/v2/models/m", timeout=10).json()
        assert meta["versions"] == ["1", "2", "3"]
    finally:
        server.stop()
