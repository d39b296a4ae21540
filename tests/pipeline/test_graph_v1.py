"""A general graph behind /v1: features read and assembled, then the graph's steps."""

from __future__ import annotations

import time

import grpc
import httpx
import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from redline.features.definitions import load_definitions
from redline.models import ModelRepository
from redline.proto import redline_v1_pb2 as pb
from redline.proto import redline_v1_pb2_grpc as pb_grpc
from tests.pipeline.conftest import PRIMARY_FEATURES, make_settings
from tests.serving.helpers import affine_model

pytestmark = [pytest.mark.slow, pytest.mark.allow_log(r"graph 'cards_graph' step 'guard'")]

GRAPH = '''
inputs:
  input: {datatype: FP32, shape: [-1, 5]}
steps:
  guard:
    kind: python
    function: steps.py:guard
    inputs: [input]
    fallback: {value: {x: [0, 0, 0, 0, 0]}}
  lin: {kind: model, model: lin.onnx, inputs: [guard.x]}
  post: {kind: python, function: "steps.py:post", inputs: [lin.s]}
outputs:
  score: post.score
'''
STEPS = '''
import numpy as np

def guard(inputs):
    x = inputs["input"]
    if (x[:, 3] > 1000).any():
        raise ValueError("amount above 1000")
    return {"x": x}

def post(inputs):
    return {"score": inputs["s"] * 2}
'''


def test_v1_serves_a_graph_after_features(serve, repo_path, defs_path, tmp_path):
    defs = load_definitions(defs_path)
    folder = tmp_path / "graph"
    folder.mkdir()
    (folder / "graph.yaml").write_text(GRAPH)
    (folder / "steps.py").write_text(STEPS)
    (folder / "lin.onnx").write_bytes(affine_model(5, 1.0, 0.0))
    ModelRepository(repo_path).add_graph(
        "cards_graph", folder, trust_code=True, sample=np.ones((2, 5), np.float32),
        feature_names=PRIMARY_FEATURES, feature_views=defs.versions())
    settings = make_settings(repo_path, defs_path)
    settings.cache.prediction_cache_entries = 100  # a degraded answer is never cached
    server = serve(settings)
    ts = int(time.time() * 1000)
    events = b"\n".join(orjson.dumps({"card_id": "g1", "amount": a, "ts": ts - i})
                        for i, a in enumerate([10.0, 30.0]))
    with httpx.Client(base_url=server.http, timeout=10) as c:
        assert c.post("/v1/events", content=events).status_code == 200
        r = c.post("/v1/models/cards_graph/predict", json={
            "entities": {"card_id": "g1"}, "request": {"amount": 120.0}})
        assert r.status_code == 200, r.text
        doc = r.json()
        # count 2, sum 40, mean 20 -> ratio 120/21; no session -> 0; score = 2 * row sum
        assert doc["prediction"] == pytest.approx(2 * (2 + 40 + 120 / 21 + 120), rel=1e-5)
        assert doc["degraded"] is False and doc["path"] == "primary"
        assert {"features", "step:guard", "step:lin", "step:post"} <= set(doc["timings_us"])
        r = c.post("/v1/models/cards_graph/predict", json={
            "entities": {"card_id": "g1"}, "request": {"amount": 5000.0}})
        doc = r.json()
        assert doc["prediction"] == 0.0 and doc["degraded"] is True
        assert any("step 'guard'" in why and "amount above 1000" in why
                   for why in doc["degraded_reasons"])
        again = c.post("/v1/models/cards_graph/predict", json={
            "entities": {"card_id": "g1"}, "request": {"amount": 5000.0}}).json()
        assert again["path"] == "primary" and again["degraded"] is True
        cached = c.post("/v1/models/cards_graph/predict", json={
            "entities": {"card_id": "g1"}, "request": {"amount": 120.0}}).json()
        assert cached["path"] == "cache" and cached["degraded"] is False
    with grpc.insecure_channel(server.grpc) as channel:
        reply = pb_grpc.PredictionServiceStub(channel).Predict(pb.PredictRequest(
            model_name="cards_graph", instances=[pb.Instance(
                entities={"card_id": "g1"}, request={"amount": 120.0})]), timeout=10)
    assert reply.predictions[0].values[0] == pytest.approx(2 * (2 + 40 + 120 / 21 + 120),
                                                           rel=1e-5)
    # Each step is a stage in /metrics too, for every request that ran it (the common ones
    # included, which leave no record): the first and the two degraded requests ran lin.
    deadline, ran = time.time() + 10, 0.0
    while time.time() < deadline and ran < 3:  # the monitor folds on its tick
        for family in text_string_to_metric_families(httpx.get(f"{server.http}/metrics").text):
            if family.name == "redline_stage_duration_seconds":
                ran = sum(s.value for s in family.samples if s.name.endswith("_count")
                          and s.labels.get("stage") == "step:lin"
                          and s.labels.get("model") == "cards_graph")
        time.sleep(0.2)
    assert ran >= 3
