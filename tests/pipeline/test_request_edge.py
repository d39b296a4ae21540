"""What a hostile or careless client sends at the edge, on a real server with both APIs (V2 and
``/v1``) over both transports (REST and gRPC): a budget that is not a number, a header that
decides access, budget or trace sent twice, a version written in other scripts' digits. Each is
a clear 4xx naming what was wrong, never a 500 or a 503 that invites retries."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import pytest

from redline.proto import grpc_service_pb2 as pb
from redline.proto import grpc_service_pb2_grpc as pbg
from redline.proto import redline_v1_pb2 as v1
from redline.proto import redline_v1_pb2_grpc as v1g
from tests.pipeline.conftest import make_settings

TOKEN = "edge-token"
ONE = {"entities": {"card_id": "e1"}, "request": {"amount": 12.5}}
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER_TRACE = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"


@pytest.fixture(scope="module")
def edge_server(tmp_path_factory: pytest.TempPathFactory, defs_path: Any,
                trained_repo: Any) -> Any:
    """One server for the module (monitoring on, as by default; the admin API on)."""
    from tests.pipeline.conftest import ServerThread

    settings = make_settings(trained_repo, defs_path)
    settings.server.admin_enabled = True
    settings.server.admin_token = TOKEN
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()


def v2_body(c: httpx.Client, model: str = "cards_small") -> dict[str, Any]:
    meta = c.get(f"/v2/models/{model}").json()
    return {"inputs": [{"name": t["name"], "datatype": t["datatype"], "shape": [1, t["shape"][-1]],
                        "data": [0.0] * t["shape"][-1]} for t in meta["inputs"]]}


# ---------------------------------------------------------------------- /v1 budget_ms
@pytest.mark.parametrize("budget", [[], {}, [1], {"ms": 5}, "20", True])
@pytest.mark.parametrize("form", ["single", "batch"])
def test_a_v1_budget_that_is_not_a_number_is_a_400_naming_the_field(
        edge_server: Any, budget: Any, form: str) -> None:
    body = {**ONE, "budget_ms": budget} if form == "single" else \
        {"instances": [ONE, ONE], "budget_ms": budget}
    with httpx.Client(base_url=edge_server.http, timeout=10) as c:
        r = c.post("/v1/models/cards/predict", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "invalid_input" and "budget_ms" in r.json()["error"]
        # a number is still a budget
        ok = c.post("/v1/models/cards/predict", json={**body, "budget_ms": 20})
        assert ok.status_code == 200, ok.text


# ---------------------------------------------------------------------- repeated headers
@pytest.mark.parametrize("first_wrong", [True, False])
def test_two_authorization_headers_are_refused_whatever_the_order(edge_server: Any,
                                                                  first_wrong: bool) -> None:
    good, bad = ("authorization", f"Bearer {TOKEN}"), ("authorization", "Bearer wrong")
    with httpx.Client(base_url=edge_server.http, timeout=10) as c:
        assert c.post("/v2/repository/index", headers=[good]).status_code == 200
        pair = [bad, good] if first_wrong else [good, bad]
        r = c.post("/v2/repository/index", headers=pair)
        assert r.status_code == 400, r.text
        assert "'authorization'" in r.json()["error"] and "once" in r.json()["error"]
        twice = c.post("/v2/repository/index", headers=[good, good])
        assert twice.status_code == 400  # even the same value: send it once


@pytest.mark.parametrize("header,values", [
    ("x-redline-budget-ms", ("5000", "50")), ("x-redline-budget-ms", ("50", "5000")),
    ("traceparent", (TRACE, OTHER_TRACE)), ("traceparent", (OTHER_TRACE, TRACE))])
def test_a_repeated_budget_or_traceparent_header_is_refused_on_rest(
        edge_server: Any, header: str, values: tuple[str, str]) -> None:
    pair = [(header, values[0]), (header, values[1])]
    with httpx.Client(base_url=edge_server.http, timeout=10) as c:
        body = v2_body(c)
        for path, doc in (("/v2/models/cards_small/infer", body),
                          ("/v2/models/cards_small/versions/1/infer", body),
                          ("/v1/models/cards/predict", ONE)):
            assert c.post(path, json=doc, headers=[pair[0]]).status_code == 200, path
            r = c.post(path, json=doc, headers=pair)
            assert r.status_code == 400, (path, r.text)
            assert r.json()["code"] == "invalid_input" and f"'{header}'" in r.json()["error"]


@pytest.mark.parametrize("values", [("5000", "50"), ("50", "5000")])
def test_repeated_budget_metadata_is_refused_on_grpc(edge_server: Any,
                                                     values: tuple[str, str]) -> None:
    """(gRPC's core keeps one ``traceparent``, the last, before the service sees the call, so
    a repeated one cannot be told apart there.)"""
    header = "x-redline-budget-ms"
    metadata = ((header, values[0]), (header, values[1]))
    with grpc.insecure_channel(edge_server.grpc) as channel:
        infer = pbg.GRPCInferenceServiceStub(channel).ModelInfer
        req = pb.ModelInferRequest(model_name="cards_small")
        req.inputs.add(name="input", datatype="FP32", shape=[1, 1])
        meta = httpx.get(f"{edge_server.http}/v2/models/cards_small").json()["inputs"][0]
        req.inputs[0].name = meta["name"]
        req.inputs[0].contents.fp32_contents.append(0.0)
        assert infer(req, metadata=metadata[:1], timeout=10).model_name == "cards_small"
        with pytest.raises(grpc.RpcError) as err:
            infer(req, metadata=metadata, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"'{header}'" in err.value.details()
        predict = v1g.PredictionServiceStub(channel).Predict
        one = v1.PredictRequest(model_name="cards", instances=[
            v1.Instance(entities={"card_id": "e1"}, request={"amount": 12.5})])
        assert predict(one, metadata=metadata[:1], timeout=10).model_name == "cards"
        with pytest.raises(grpc.RpcError) as err:
            predict(one, metadata=metadata, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"'{header}'" in err.value.details()


# ---------------------------------------------------------------------- version digits
@pytest.mark.parametrize("digit", ["%D9%A1", "\uff11", "\u0967"])
def test_a_version_in_other_scripts_digits_is_a_404(edge_server: Any, digit: str) -> None:
    with httpx.Client(base_url=edge_server.http, timeout=10) as c:
        body = v2_body(c, "cards")
        assert c.post("/v2/models/cards/versions/1/infer", json=body).status_code == 200
        assert c.post("/v1/models/cards/versions/1/predict", json=ONE).status_code == 200
        for path, doc in ((f"/v2/models/cards/versions/{digit}/infer", body),
                          (f"/v1/models/cards/versions/{digit}/predict", ONE)):
            r = c.post(path, json=doc)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["code"] == "version_not_found"
        for path in (f"/v2/models/cards/versions/{digit}",
                     f"/v2/models/cards/versions/{digit}/ready"):
            assert c.get(path).status_code == 404, path
    text = httpx.URL(f"http://x/{digit}").path[1:] if "%" in digit else digit
    with grpc.insecure_channel(edge_server.grpc) as channel:
        predict = v1g.PredictionServiceStub(channel).Predict
        with pytest.raises(grpc.RpcError) as err:
            predict(v1.PredictRequest(model_name="cards", model_version=text, instances=[
                v1.Instance(entities={"card_id": "e1"}, request={"amount": 12.5})]), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
