"""`redline serve` as a real process with a Python model: short runs happen on the event loop
(its main thread, where the inline guard works), and a hang there is stopped within
milliseconds, then cut by the request's budget, while the server keeps answering."""

from __future__ import annotations

import os
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
from tests.models import pymodels as pm
from tests.serving.helpers import affine_model

pytestmark = [pytest.mark.slow,
              pytest.mark.allow_log(r"model 'moody:1': a run (on the event loop|outlived)",
                                    r"model 'moody' version 1: predict raised",
                                    r"ValueError: unlucky row 0")]


def body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}


def test_a_hang_on_the_loop_is_stopped_and_cut_by_the_budget(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path / "repo")
    repo.add_python("moody", pm.write(tmp_path / "src", pm.MOODY), pm.rows(4), trust_code=True)
    repo.add_onnx("affine", affine_model())
    http = free_port()
    proc = LoggedPopen(
        [sys.executable, "-m", "redline.cli", "serve", "--repository", str(tmp_path / "repo"),
         "--http-port", str(http), "--grpc-port", str(free_port()), "--no-watch",
         "--workers", "1"],
        source="redline serve", log=tmp_path / "serve.log",
        env={**os.environ, "REDLINE_TEST_HANG_S": "3"})
    url = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.log_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=10) as client:
            for _ in range(50):  # short runs: on the loop
                r = client.post("/v2/models/moody/infer", json=body(pm.rows(1)))
                assert r.status_code == 200, r.text
            r = client.post("/v2/models/moody/infer", json=body(pm.rows(1, first=13)))
            assert r.status_code == 500 and r.json()["code"] == "model_error"
            slowest: list[float] = []

            def other_model() -> None:
                with httpx.Client(base_url=url, timeout=10) as c:
                    for _ in range(20):
                        t = time.monotonic()
                        assert c.post("/v2/models/affine/infer", json={"inputs": [
                            {"name": "x", "shape": [1, 4], "datatype": "FP32",
                             "data": [1, 2, 3, 4]}]}).status_code == 200
                        slowest.append(time.monotonic() - t)
                        time.sleep(0.02)

            t0 = time.monotonic()
            others = threading.Thread(target=other_model)
            others.start()
            r = client.post("/v2/models/moody/infer", json=body(pm.rows(1, first=99)),
                            headers={"x-redline-budget-ms": "500"})
            took = time.monotonic() - t0
            others.join()
            assert r.status_code == 504 and r.json()["code"] == "deadline_exceeded", r.text
            assert took < 2.0, took
            assert max(slowest) < 1.0, slowest  # the loop was never held for the hang
            ok = client.post("/v2/models/moody/infer", json=body(pm.rows(1)))
            assert ok.status_code == 200
        log = proc.log_text()
        assert "a run on the event loop took longer than 5 ms and was stopped" in log
    finally:
        proc.kill()
        proc.wait(10)
