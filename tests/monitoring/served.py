"""A served binary classifier with a training profile, and a server with monitoring on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from redline.config import Settings
from redline.models import ModelRepository
from tests.serving.helpers import ServerThread

FEATURES = ["amount", "age", "channel"]
WEIGHTS = np.array([0.8, -0.05, 0.3], np.float32)
BIAS = -0.5
ADMIN_TOKEN = "monitoring-token"


def training_data(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.column_stack([rng.normal(2, 1, n), rng.normal(40, 10, n),
                            rng.choice(3, n, p=[0.6, 0.3, 0.1])]).astype(np.float32)


def probability(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-(x @ WEIGHTS + BIAS)))


def logistic_model(weights: np.ndarray = WEIGHTS, bias: float = BIAS) -> bytes:
    """p = sigmoid(x·w + b); outputs ``label`` and ``probabilities`` like the converters'."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["z0"]),
        helper.make_node("Add", ["z0", "b"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["p1"]),
        helper.make_node("Sub", ["one", "p1"], ["p0"]),
        helper.make_node("Concat", ["p0", "p1"], ["probabilities"], axis=1),
        helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=0),
    ]
    inits = [numpy_helper.from_array(weights.astype(np.float32).reshape(-1, 1), "w"),
             numpy_helper.from_array(np.array([bias], np.float32), "b"),
             numpy_helper.from_array(np.array([1.0], np.float32), "one")]
    graph = helper.make_graph(
        nodes, "logistic", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          [None, len(weights)])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def make_repository(root: Path) -> ModelRepository:
    repo = ModelRepository(root)
    sample = training_data(np.random.default_rng(0), 5000)
    repo.add_onnx("fraud", logistic_model(), task="classification", class_labels=[0, 1],
                  feature_names=FEATURES, metrics={"roc_auc": 0.7, "accuracy": 0.6},
                  sample=sample)
    return repo


def monitored_settings(tick_s: float = 0.2) -> Settings:
    settings = Settings()
    settings.server.admin_enabled = True
    settings.server.admin_token = ADMIN_TOKEN
    settings.server.watch_repository = False
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    settings.monitoring.tick_s = tick_s
    settings.monitoring.drift_min_rows = 100
    settings.monitoring.review_per_minute = 600
    return settings


def start(root: Path, settings: Settings | None = None) -> ServerThread:
    return ServerThread(settings or monitored_settings(), make_repository(root)).start()


def v2_body(x: np.ndarray, request_id: str | None = None) -> dict:
    body: dict = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                              "data": x.reshape(-1).tolist()}]}
    if request_id is not None:
        body["id"] = request_id
    return body


def in_process_pair(tmp: Any, loop: asyncio.AbstractEventLoop) -> dict[bool, Any]:
    """An unmonitored and a monitored ``RedlineServer`` (by ``monitoring.enabled``), each over
    its own copy of the repository, synced on ``loop`` and not served: their apps and servicers
    are called directly, to compare the monitored path's answers with the plain one's."""
    from redline.assembly import build_server

    servers = {}
    for monitored in (False, True):
        s = Settings()
        s.server.watch_repository = False
        s.server.grpc_enabled = False
        s.monitoring.enabled = monitored
        s.runtime.warmup_batch_sizes = [1]
        s.server.max_body_bytes = 1 << 20
        server = build_server(s, make_repository(tmp.mktemp(f"m{monitored}")))
        loop.run_until_complete(server.registry.sync())
        servers[monitored] = server
    assert servers[True].observers.stage_times is not None  # the flat path is on
    return servers
