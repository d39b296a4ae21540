"""`redline serve` configured for CUDA on a machine whose onnxruntime has no CUDA: it starts, says
so once in its log and in the readiness answer, and serves on the CPU."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import onnxruntime as ort
import pytest

from redline.models import ModelRepository
from tests.conftest import free_port
from tests.logwatch import LoggedPopen
from tests.serving.helpers import affine_model

pytestmark = pytest.mark.slow  # a child server


def test_cuda_asked_for_without_it_serves_on_cpu_and_says_so(tmp_path: Path) -> None:
    assert "CUDAExecutionProvider" not in ort.get_available_providers(), \
        "the suite runs on the CPU build of onnxruntime (the dev extra installs it)"
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    repo.add_onnx("double", affine_model(scale=4.0))
    config = tmp_path / "redline.yaml"
    config.write_text("runtime:\n  providers: [CUDAExecutionProvider, CPUExecutionProvider]\n"
                      "  warmup_batch_sizes: [1]\n  warmup_runs: 1\n")
    http = free_port()
    proc = LoggedPopen(
        [sys.executable, "-m", "redline.cli", "serve", "--config", str(config), "--repository",
         str(tmp_path / "repo"), "--http-port", str(http), "--grpc-port", str(free_port()),
         "--no-watch", "--workers", "1"],
        source="redline serve (CUDA asked for)", log=tmp_path / "serve.log")
    url = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                ready = httpx.get(f"{url}/v2/health/ready", timeout=1)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redline serve did not become ready: {proc.log_text()[-3000:]}")
            time.sleep(0.1)
        answer = httpx.post(f"{url}/v2/models/affine/infer", json={"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).json()
    finally:
        proc.terminate()
        proc.wait(20)
    assert answer["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]  # served, on the CPU
    body = ready.json()
    assert [(f["model"], f["version"]) for f in body["provider_fallback"]] == [
        ("affine", "1"), ("double", "1")]
    reason = body["provider_fallback"][0]["reason"]
    assert reason.startswith("runtime.providers asks for CUDAExecutionProvider: ")
    assert "not in this onnxruntime build" in reason and "redline[gpu]" in reason
    assert "Serving on CPUExecutionProvider" in reason
    warnings = [line for line in proc.log_text().splitlines()
                if " WARNING " in line and "runtime.providers asks for" in line]
    assert len(warnings) == 1, proc.log_text()[-3000:]  # one line, not one a model
    assert reason in warnings[0]
