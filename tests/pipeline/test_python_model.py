"""A Python model behind /v1: features read, transformed and assembled, then ``predict``."""

from __future__ import annotations

import time

import grpc
import httpx
import orjson
import pytest

from redline.features.definitions import load_definitions
from redline.models import ModelRepository
from redline.proto import redline_v1_pb2 as pb
from redline.proto import redline_v1_pb2_grpc as pb_grpc
from tests.models import pymodels as pm
from tests.pipeline.conftest import PRIMARY_FEATURES, make_settings

pytestmark = pytest.mark.slow  # a server and a worker process

WEIGHTS = [1.0, 0.1, 10.0, 0.01, 1.0]
SCORER = f'''
WEIGHTS = np.array({WEIGHTS!r}, dtype=np.float32)


class Model:
    inputs = {{"input": ("FP32", [-1, {len(WEIGHTS)}])}}
    outputs = {{"score": ("FP32", [-1])}}

    def predict(self, inputs):
        return {{"score": inputs["input"] @ WEIGHTS}}
'''


def expected(row: list[float]) -> float:
    return sum(w * v for w, v in zip(WEIGHTS, row, strict=True))


def test_v1_serves_a_python_model_after_features(serve, repo_path, defs_path, tmp_path):
    defs = load_definitions(defs_path)
    repo = ModelRepository(repo_path)
    sample = pm.rows(4)[:, :len(WEIGHTS)]
    repo.add_python("cards_py", pm.write(tmp_path / "src", SCORER), sample, trust_code=True,
                    feature_names=PRIMARY_FEATURES, feature_views=defs.versions())
    server = serve(make_settings(repo_path, defs_path))
    ts = int(time.time() * 1000)
    events = b"\n".join(orjson.dumps({"card_id": "p1", "amount": a, "ts": ts - i})
                        for i, a in enumerate([10.0, 30.0]))
    with httpx.Client(base_url=server.http, timeout=10) as c:
        assert c.post("/v1/events", content=events).status_code == 200
        r = c.post("/v1/models/cards_py/predict", json={
            "entities": {"card_id": "p1"}, "request": {"amount": 120.0}})
        assert r.status_code == 200, r.text
        doc = r.json()
    # count 2, sum 40, mean 20 -> ratio 120/21; no session -> 0.
    assert doc["prediction"] == pytest.approx(expected([2, 40, 120 / 21, 120, 0]), rel=1e-5)
    assert doc["model_name"] == "cards_py" and doc["path"] == "primary"
    assert {"features", "inference"} <= set(doc["timings_us"])
    with grpc.insecure_channel(server.grpc) as channel:
        reply = pb_grpc.PredictionServiceStub(channel).Predict(pb.PredictRequest(
            model_name="cards_py", instances=[pb.Instance(
                entities={"card_id": "p1"}, request={"amount": 120.0})]), timeout=10)
    assert reply.path == "primary"
    assert reply.predictions[0].values[0] == pytest.approx(doc["prediction"], rel=1e-5)
