"""Requests whose inputs are not the profile's rows: a batched 1-D input and another width
reach the drift and quality windows without breaking the tick, and are still counted."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
from onnx import TensorProto, helper

from redline.models import ModelRepository
from tests.monitoring.served import monitored_settings
from tests.serving.helpers import ServerThread


def _scaler_1d() -> bytes:
    """y = 2x over a batched 1-D input ([None]): each element is a row of one value."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])], "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])], [two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_batched_1d_input_of_several_row_counts_is_windowed(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path / "models")
    sample = np.random.default_rng(0).normal(size=(500,)).astype(np.float32)
    repo.add_onnx("scale", _scaler_1d(), sample=sample)
    settings = monitored_settings(tick_s=0.1)
    settings.monitoring.drift_min_rows = 10
    server = ServerThread(settings, repo).start()
    try:
        with httpx.Client(base_url=server.http, timeout=10) as c:
            for n in (1, 3, 7, 2, 5) * 8:
                x = np.arange(n, dtype=np.float32)
                body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [n],
                                    "data": x.tolist()}]}
                r = c.post("/v2/models/scale/infer", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["outputs"][0]["data"] == (2 * x).tolist()
            assert server.call(server.server.monitor.tick()) is None  # folds without an error
            metrics = c.get("/metrics").text
        count = next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                     if line.startswith("redline_requests_total{") and 'model="scale"' in line
                     and 'status="ok"' in line)
        assert count == 40
    finally:
        server.stop()
    assert server.error is None
