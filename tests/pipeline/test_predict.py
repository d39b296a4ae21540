"""The /v1 predict path against real servers: both stores, defaults, 400s, batch form, gRPC."""

from __future__ import annotations

import time

import grpc
import httpx
import numpy as np
import orjson
import pytest

from redline.models import InferenceSession, ModelRepository
from tests.pipeline.conftest import make_settings

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def events(card: str, amounts: list[float]) -> bytes:
    ts = int(time.time() * 1000)
    return b"\n".join(orjson.dumps({"card_id": card, "amount": a, "ts": ts - i})
                      for i, a in enumerate(amounts))


def expected_score(repo_path, row: list[float]) -> float:
    sess = InferenceSession.load(ModelRepository(repo_path), "cards")
    out = sess.run({"input": np.array([row], dtype=np.float32)})
    return float(out["probabilities"][0, 1])


def test_predict_reads_features_applies_transform_and_answers(server, repo_path):
    with httpx.Client(base_url=server.http, timeout=10) as c:
        r = c.post("/v1/events", content=events("c1", [10.0, 30.0]))
        assert r.status_code == 200, r.text
        assert r.json()["accepted"] == 2
        r = c.post("/v1/models/cards/predict", json={
            "entities": {"card_id": "c1"}, "request": {"amount": 120.0}, "request_id": "r-1"})
        assert r.status_code == 200, r.text
        doc = r.json()
    # count 2, sum 40, mean 20 -> ratio 120/21; no session -> 0.
    want = expected_score(repo_path, [2, 40, 120 / 21, 120, 0])
    assert doc["prediction"] == pytest.approx(want, abs=1e-5)
    assert doc["label"] in (0, 1)
    assert doc["model_name"] == "cards" and doc["model_version"] == "1"
    assert doc["path"] == "primary" and doc["degraded"] is False
    assert doc["degraded_reasons"] == [] and doc["entity_missing"] is False
    assert doc["request_id"] == "r-1"
    # The stages of serving/stages.py, as the request's RequestRecord timed them.
    assert {"decode", "features", "admission", "inference", "total"} <= set(doc["timings_us"])


def test_missing_entity_uses_defaults_and_is_flagged(server, repo_path):
    with httpx.Client(base_url=server.http, timeout=10) as c:
        doc = c.post("/v1/models/cards/predict", json={
            "entities": {"card_id": "never-seen"}, "request": {"amount": 5.0}}).json()
    assert doc["entity_missing"] is True and doc["degraded"] is False
    # Declared defaults: count 0, sum 0, mean 0 -> ratio 5/1.
    assert doc["prediction"] == pytest.approx(expected_score(repo_path, [0, 0, 5.0, 5.0, 0]),
                                              abs=1e-5)


def test_batch_form_scores_many_entities_in_one_call(server, repo_path):
    with httpx.Client(base_url=server.http, timeout=10) as c:
        c.post("/v1/events", content=events("b1", [100.0]))
        r = c.post("/v1/models/cards/predict", json={"instances": [
            {"entities": {"card_id": "b1"}, "request": {"amount": 50.0}},
            {"entities": {"card": "nobody"}, "request": {"amount": 7.0}},
        ]})
        assert r.status_code == 200, r.text
        doc = r.json()
    rows = doc["predictions"]
    assert [p["entity_missing"] for p in rows] == [False, True]
    assert rows[0]["prediction"] == pytest.approx(
        expected_score(repo_path, [1, 100, 50 / 101, 50, 0]), abs=1e-5)
    assert rows[1]["prediction"] == pytest.approx(
        expected_score(repo_path, [0, 0, 7.0, 7.0, 0]), abs=1e-5)


@pytest.mark.parametrize("body, needle", [
    ({"entities": {"card_id": "c"}, "request": {}}, "missing required request field 'amount'"),
    ({"entities": {"card_id": "c", "shop": "s"}, "request": {"amount": 1}},
     "unknown entity key 'shop'"),
    ({"entities": {}, "request": {"amount": 1}}, "missing entity key 'card_id'"),
    ({"entities": {"card_id": "c"}, "request": {"amount": "lots"}}, "must be a number"),
    ({"instances": []}, "non-empty list"),
    ({"instances": [{"entities": {"card_id": "c"}, "request": {"amount": 1}},
                    {"entities": {"card_id": "c"}, "request": {}}]},
     "'amount' in instances[1]"),
    ({"entities": {"card_id": "c"}, "request": {"amount": 1}, "budget_ms": -3}, "budget_ms"),
    ([1, 2], "JSON object"),
])
def test_user_errors_are_400s_that_name_the_problem(server, body, needle):
    with httpx.Client(base_url=server.http, timeout=10) as c:
        r = c.post("/v1/models/cards/predict", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]
    assert r.json()["code"] == "invalid_input"


def test_malformed_json_and_unknown_model(server):
    with httpx.Client(base_url=server.http, timeout=10) as c:
        r = c.post("/v1/models/cards/predict", content=b"{nope")
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
        r = c.post("/v1/models/nope/predict", json={"entities": {}, "request": {}})
        assert r.status_code == 404 and "nope" in r.json()["error"]


def test_grpc_predict_has_the_same_meaning(server, repo_path):
    from redline.proto import redline_v1_pb2 as v1
    from redline.proto import redline_v1_pb2_grpc as v1g

    with httpx.Client(base_url=server.http, timeout=10) as c:
        c.post("/v1/events", content=events("g1", [10.0, 30.0]))
        rest = c.post("/v1/models/cards/predict", json={
            "entities": {"card_id": "g1"}, "request": {"amount": 120.0}}).json()
    with grpc.insecure_channel(server.grpc) as channel:
        stub = v1g.PredictionServiceStub(channel)
        resp = stub.Predict(v1.PredictRequest(
            model_name="cards", request_id="g",
            instances=[v1.Instance(entities={"card_id": "g1"}, request={"amount": 120.0})]),
            timeout=10)
        assert resp.path == "primary" and not resp.degraded and resp.request_id == "g"
        assert resp.predictions[0].values[0] == pytest.approx(rest["prediction"], abs=1e-6)
        assert resp.model_version == "1" and resp.timings_us["total"] > 0
        with pytest.raises(grpc.RpcError) as err:
            stub.Predict(v1.PredictRequest(model_name="cards", instances=[
                v1.Instance(entities={"card_id": "g1"})]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'amount'" in err.value.details()


@pytest.mark.allow_log(r"model stale is not ready: .* cannot be served with these features")
def test_model_pinned_to_other_view_versions_is_refused(serve, repo_path, defs_path):
    from sklearn.linear_model import LogisticRegression

    x = np.random.default_rng(2).random((100, 2)).astype(np.float32)
    ModelRepository(repo_path).add_estimator(
        "stale", LogisticRegression().fit(x, (x[:, 0] > 0.5).astype(int)), x,
        feature_names=["card_txn:count_1h", "amount"], feature_views={"card_txn": "0123456789ab"})
    srv = serve(make_settings(repo_path, defs_path))
    with httpx.Client(base_url=srv.http, timeout=10) as c:
        r = c.post("/v1/models/stale/predict",
                   json={"entities": {"card_id": "c"}, "request": {"amount": 1}})
        ready = c.get("/v2/models/stale/ready")
    # refused when it loads: not ready, the reason logged and in every answer
    assert r.status_code == 503 and ready.status_code != 200
    doc = r.json()
    assert doc["code"] == "model_not_ready"
    assert "'card_txn' is served at version" in doc["error"] and "0123456789ab" in doc["error"]
    assert "retrain" in doc["error"]
