"""TF Serving's REST API and KServe's V1 protocol against a real server, with the request and
response examples of their references: ``half_plus_three``'s ``{"instances": [1.0, 2.0, 5.0]}``
-> ``{"predictions": [3.5, 4.0, 5.5]}``, the three named inputs ``tag``/``signal``/``sensor`` in
row and columnar form, the model status and metadata answers, and ``{"error": ...}`` bodies;
then a ``/v1`` model with features through the same ``:predict``."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from redline.config import ModelSettings
from redline.serving.stages import RequestRecord
from tests.pipeline.conftest import HERE as PIPELINE_TESTS
from tests.pipeline.conftest import make_settings, train_models
from tests.serving.helpers import ServerThread, _model

pytestmark = pytest.mark.slow  # a server of its own


def half_plus(offset: float) -> bytes:
    """TF Serving's ``half_plus_three`` toy (``y = 0.5 * x + offset``) over a 1-D batch."""
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(offset, np.float32), "offset")]
    return _model([helper.make_node("Mul", ["x", "half"], ["h"]),
                   helper.make_node("Add", ["h", "offset"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])], inits)


def three_inputs() -> bytes:
    """The reference's three named inputs: ``tag`` (string), ``signal`` [5], ``sensor`` [2, 2];
    outputs ``tag`` back and ``signal_sum``."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    return _model(
        [helper.make_node("Identity", ["tag"], ["tag_out"]),
         helper.make_node("ReduceSum", ["signal", "axes"], ["signal_sum"], keepdims=0),
         helper.make_node("Identity", ["sensor"], ["sensor_out"])],
        [helper.make_tensor_value_info("tag", TensorProto.STRING, [None]),
         helper.make_tensor_value_info("signal", TensorProto.FLOAT, [None, 5]),
         helper.make_tensor_value_info("sensor", TensorProto.FLOAT, [None, 2, 2])],
        [helper.make_tensor_value_info("tag_out", TensorProto.STRING, [None]),
         helper.make_tensor_value_info("signal_sum", TensorProto.FLOAT, [None]),
         helper.make_tensor_value_info("sensor_out", TensorProto.FLOAT, [None, 2, 2])],
        [axes])


class Records:
    """An observer that keeps every finished request's record."""

    def __init__(self) -> None:
        self.seen: list[RequestRecord] = []

    def request_finished(self, record: RequestRecord) -> None:
        self.seen.append(record)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    defs = tmp_path_factory.mktemp("defs") / "defs_cards.py"
    shutil.copy(PIPELINE_TESTS / "defs_cards.py", defs)
    root = tmp_path_factory.mktemp("models")
    repo = train_models(root, defs)  # cards (features + request field) and cards_small
    repo.add_onnx("half_plus_three", half_plus(2.0))
    repo.add_onnx("half_plus_three", half_plus(3.0))
    repo.add_onnx("tagged", three_inputs())
    repo.add_onnx("half_nan", half_plus(3.0), missing_values="allow")
    settings = make_settings(root, defs)
    settings.models["half_plus_three"] = ModelSettings(version_policy="all")
    # Records are checked with an observer of the test's own (below), not the monitor's windows.
    settings.monitoring.enabled = False
    server = ServerThread(settings).start()
    yield server
    server.stop()


@pytest.fixture
def client(srv: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.http, timeout=30) as c:
        yield c


def error_of(r: httpx.Response, status: int) -> str:
    """The message of TF Serving's error body, checked to be exactly ``{"error": ...}``."""
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"]
    assert r.headers["x-redline-error-code"]
    return body["error"]


# ---------------------------------------------------------------------- the references' examples
def test_predict_half_plus_three(client: httpx.Client) -> None:
    r = client.post("/v1/models/half_plus_three:predict", json={"instances": [1.0, 2.0, 5.0]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [3.5, 4.0, 5.5]}
    assert r.headers["x-redline-model-version"] == "2"
    # the columnar form of the same request answers "outputs"
    r = client.post("/v1/models/half_plus_three:predict", json={"inputs": [1.0, 2.0, 5.0]})
    assert r.json() == {"outputs": [3.5, 4.0, 5.5]}
    # the signature TF Serving clients name by default is accepted
    r = client.post("/v1/models/half_plus_three:predict",
                    json={"signature_name": "serving_default", "instances": [1.0]})
    assert r.json() == {"predictions": [3.5]}


def test_unknown_model_is_404_as_tf_serving_answers(client: httpx.Client) -> None:
    r = client.post("/v1/models/half:predict", json={"instances": [1.0, 5.0]})
    assert "model 'half' is not served" in error_of(r, 404)
    assert r.headers["x-redline-error-code"] == "model_not_found"


def test_version_and_label_paths(client: httpx.Client) -> None:
    r = client.post("/v1/models/half_plus_three/versions/1:predict",
                    json={"instances": [1.0, 2.0, 5.0]})
    assert r.json() == {"predictions": [2.5, 3.0, 4.5]}
    r = client.post("/v1/models/half_plus_three/labels/latest:predict",
                    json={"instances": [1.0]})
    assert r.json() == {"predictions": [3.5]}
    r = client.post("/v1/models/half_plus_three/versions/9:predict", json={"instances": [1.0]})
    assert "no version 9" in error_of(r, 404)


def test_row_format_with_named_inputs(client: httpx.Client) -> None:
    """The reference's two instances of three named inputs, and its columnar twin."""
    rows = {"instances": [
        {"tag": "foo", "signal": [1, 2, 3, 4, 5], "sensor": [[1, 2], [3, 4]]},
        {"tag": "bar", "signal": [3, 4, 1, 2, 5], "sensor": [[4, 5], [6, 8]]},
    ]}
    r = client.post("/v1/models/tagged:predict", json=rows)
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [
        {"tag_out": "foo", "signal_sum": 15.0, "sensor_out": [[1.0, 2.0], [3.0, 4.0]]},
        {"tag_out": "bar", "signal_sum": 15.0, "sensor_out": [[4.0, 5.0], [6.0, 8.0]]},
    ]}
    columns = {"inputs": {"tag": ["foo", "bar"],
                          "signal": [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]],
                          "sensor": [[[1, 2], [3, 4]], [[4, 5], [6, 8]]]}}
    r = client.post("/v1/models/tagged:predict", json=columns)
    assert r.json() == {"outputs": {"tag_out": ["foo", "bar"], "signal_sum": [15.0, 15.0],
                                    "sensor_out": [[[1.0, 2.0], [3.0, 4.0]],
                                                   [[4.0, 5.0], [6.0, 8.0]]]}}


def test_model_status(client: httpx.Client) -> None:
    ok = {"error_code": "OK", "error_message": ""}
    r = client.get("/v1/models/half_plus_three")
    assert r.json() == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": ok},
        {"version": "2", "state": "AVAILABLE", "status": ok}]}
    r = client.get("/v1/models/half_plus_three/versions/1")
    assert r.json() == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": ok}]}
    assert "no version 7" in error_of(client.get("/v1/models/half_plus_three/versions/7"), 404)
    assert "is not served" in error_of(client.get("/v1/models/nope"), 404)
    # KServe V1's list of models
    assert "half_plus_three" in client.get("/v1/models").json()["models"]


def test_model_metadata(client: httpx.Client) -> None:
    r = client.get("/v1/models/tagged/metadata")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["model_spec"] == {"name": "tagged", "signature_name": "", "version": "1"}
    signature = doc["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["method_name"] == "tensorflow/serving/predict"
    assert signature["inputs"]["signal"] == {
        "dtype": "DT_FLOAT", "name": "signal",
        "tensor_shape": {"dim": [{"size": "-1", "name": ""}, {"size": "5", "name": ""}],
                         "unknown_rank": False}}
    assert signature["inputs"]["tag"]["dtype"] == "DT_STRING"
    assert set(signature["outputs"]) == {"tag_out", "signal_sum", "sensor_out"}
    r = client.get("/v1/models/half_plus_three/versions/1/metadata")
    assert r.json()["model_spec"]["version"] == "1"


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("body", "says"), [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b"{}", "either 'instances'"),
    (b'{"instances": [1.0], "inputs": [1.0]}', "not both"),
    (b'{"instances": []}', "non-empty list"),
    (b'{"instances": "abc"}', "non-empty list"),
    (b'{"instances": ["1.0"]}', "not numbers"),
    (b'{"instances": [[1.0, 2.0], [3.0]]}', "input 'x'"),
    (b'{"instances": [true]}', "not numbers"),
    (b'{"instances": [NaN, 1.0]}', "NaN"),
    (b'{"instances": [1e39]}', "outside the range"),
    (b'{"signature_name": "classify", "instances": [1.0]}', "one signature"),
    (b'{"instances": [{"y": 1.0}]}', "takes inputs ['x']"),
])
def test_malformed_predict_bodies_get_a_clear_400(client: httpx.Client, body: bytes,
                                                   says: str) -> None:
    r = client.post("/v1/models/half_plus_three:predict", content=body)
    assert says in error_of(r, 400)


def test_named_inputs_must_all_be_there(client: httpx.Client) -> None:
    r = client.post("/v1/models/tagged:predict",
                    json={"instances": [{"tag": "foo", "signal": [1, 2, 3, 4, 5]}]})
    assert "missing: ['sensor']" in error_of(r, 400)
    r = client.post("/v1/models/tagged:predict", json={"instances": ["foo"]})
    assert "object of them" in error_of(r, 400)


def test_nan_reaches_a_model_that_allows_missing_values(client: httpx.Client) -> None:
    """TF Serving's JSON allows NaN and Infinity tokens: a model refusing missing values says so
    (above); one that allows them gets them (JSON has no NaN: the answer writes null)."""
    r = client.post("/v1/models/half_nan:predict", content=b'{"instances": [NaN, 1.0]}')
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [None, 3.5]}
    r = client.post("/v1/models/half_nan:predict", content=b'{"instances": [-Infinity]}')
    assert r.json() == {"predictions": [None]}


def test_verbs_and_methods(client: httpx.Client) -> None:
    assert "is not served" in error_of(
        client.post("/v1/models/half_plus_three:regress", json={"examples": []}), 404)
    assert "POST /v1/models" in error_of(
        client.post("/v1/models/half_plus_three", json={"instances": [1.0]}), 404)
    r = client.get("/v1/models/half_plus_three:predict")
    assert "with POST" in error_of(r, 404)
    # the /v1 routes and V2 beside these are untouched
    assert client.post("/v2/models/half_plus_three/infer", json={"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}).json()[
            "outputs"][0]["data"] == [3.5]
    assert client.get("/v2/models/half_plus_three").status_code == 200


def test_budget_header_is_checked(client: httpx.Client) -> None:
    r = client.post("/v1/models/half_plus_three:predict", json={"instances": [1.0]},
                    headers={"x-redline-budget-ms": "-5"})
    assert "x-redline-budget-ms" in error_of(r, 400)


# ---------------------------------------------------------------------- a /v1 model
def test_v1_model_instances_are_entities_and_request_fields(client: httpx.Client) -> None:
    """``cards`` reads card features and the request's ``amount``: each instance's entity key
    becomes ``entities``, the rest ``request``, through the /v1 pipeline."""
    body = {"instances": [{"card_id": "c1", "amount": 12.5}, {"card_id": "c2", "amount": 900}]}
    r = client.post("/v1/models/cards:predict", json=body)
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    assert list(r.json()) == ["predictions"] and len(preds) == 2
    assert all(isinstance(p, float) and 0.0 <= p <= 1.0 for p in preds)
    assert r.headers["x-redline-path"] == "primary"
    # the same rows on /v1 give the same predictions
    v1 = client.post("/v1/models/cards/predict", json={"instances": [
        {"entities": {"card_id": "c1"}, "request": {"amount": 12.5}},
        {"entities": {"card_id": "c2"}, "request": {"amount": 900}}]}).json()
    assert preds == [p["prediction"] for p in v1["predictions"]]
    # columnar: one list per name
    r = client.post("/v1/models/cards:predict",
                    json={"inputs": {"card_id": ["c1", "c2"], "amount": [12.5, 900]}})
    assert r.json() == {"outputs": preds}


def test_v1_model_errors_are_tf_serving_errors(client: httpx.Client) -> None:
    r = client.post("/v1/models/cards:predict", json={"instances": [{"card_id": "c1"}]})
    assert "missing required request field 'amount'" in error_of(r, 400)
    r = client.post("/v1/models/cards:predict", json={"instances": [{"amount": 3.0}]})
    assert "missing entity key 'card_id'" in error_of(r, 400)
    r = client.post("/v1/models/cards:predict",
                    json={"instances": [{"card_id": "c1", "amount": "lots"}]})
    assert "must be a number" in error_of(r, 400)


def test_v1_model_takes_raw_feature_rows_as_tensors(client: httpx.Client) -> None:
    """A list row is the model's input tensor itself, as on V2 infer."""
    r = client.post("/v1/models/cards:predict", json={"instances": [[1.0, 50.0, 1.0, 50.0, 0.0]]})
    assert r.status_code == 200, r.text
    (pred,) = r.json()["predictions"]
    assert set(pred) == {"label", "probabilities"}


def test_requests_are_monitored_as_their_api(srv: ServerThread, client: httpx.Client) -> None:
    records = Records()
    srv.server.observers.add(records)
    try:
        client.post("/v1/models/half_plus_three:predict", json={"instances": [1.0]})
        client.post("/v1/models/half_plus_three:predict", content=b"{oops")
        client.post("/v1/models/cards:predict",
                    json={"instances": [{"card_id": "c1", "amount": 1.0}]})
    finally:
        srv.server.observers.remove(records)
    seen: list[tuple[Any, ...]] = [(r.api, r.model, r.status) for r in records.seen]
    assert seen == [("v2", "half_plus_three", "ok"), ("v2", "", "invalid_input"),
                    ("v1", "cards", "ok")]

