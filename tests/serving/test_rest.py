"""Every REST path and every user error, with httpx against the real server."""

from __future__ import annotations

import struct

import httpx
import numpy as np
import orjson
import pytest

from tests.serving.conftest import ADMIN_TOKEN, MAX_BODY
from tests.serving.helpers import ServerThread


@pytest.fixture(scope="module")
def client(served: ServerThread):  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=served.http, timeout=30) as c:
        yield c


def infer_body(x: np.ndarray, datatype: str = "FP32", name: str = "x", **extra):  # type: ignore[no-untyped-def]
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": datatype,
                        "data": x.tolist()}], **extra}


def test_server_paths(client: httpx.Client) -> None:
    meta = client.get("/v2").json()
    assert meta["name"] == "redline" and "binary_tensor_data" in meta["extensions"]
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").json() == {"ready": True}


def test_model_paths(client: httpx.Client) -> None:
    for path in ("/v2/models/affine", "/v2/models/affine/versions/1"):
        meta = client.get(path).json()
        assert meta["name"] == "affine" and meta["versions"] == ["1"]
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        assert [o["name"] for o in meta["outputs"]] == ["y", "s"]
        assert client.get(path + "/ready").status_code == 200
    config = client.get("/v2/models/affine/config").json()
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    stats = client.get("/v2/models/affine/stats").json()
    assert stats["name"] == "affine" and "expired" in stats


def test_infer_json_nested_and_flat(client: httpx.Client) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for data in (x.tolist(), x.ravel().tolist()):
        body = {"id": "req-7", "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                                           "data": data}],
                "parameters": {"note": "anything"}}
        r = client.post("/v2/models/affine/infer", json=body)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["id"] == "req-7" and doc["model_name"] == "affine"
        assert doc["model_version"] == "1"
        out = {o["name"]: o for o in doc["outputs"]}
        assert out["y"]["shape"] == [2, 4] and out["y"]["datatype"] == "FP32"
        assert np.allclose(np.array(out["y"]["data"]).reshape(2, 4), x * 2)
        assert np.allclose(out["s"]["data"], x.sum(axis=1))
        assert "parameters" not in out["y"]  # perf_analyzer rejects parameters without size


def test_infer_versioned_path_and_requested_outputs(client: httpx.Client) -> None:
    x = np.ones((1, 4), np.float32)
    r = client.post("/v2/models/affine/versions/1/infer",
                    json=infer_body(x, outputs=[{"name": "s"}]))
    assert r.status_code == 200
    assert [o["name"] for o in r.json()["outputs"]] == ["s"]


def test_binary_extension_both_ways(client: httpx.Client) -> None:
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}},
                                     {"name": "s", "parameters": {"binary_data": False}}]})
    r = client.post("/v2/models/affine/infer", content=head + x.tobytes(),
                    headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.text
    n = int(r.headers["inference-header-content-length"])
    doc = orjson.loads(r.content[:n])
    out = {o["name"]: o for o in doc["outputs"]}
    assert out["y"]["parameters"] == {"binary_data_size": 48} and "data" not in out["y"]
    y = np.frombuffer(r.content[n:], dtype="<f4").reshape(3, 4)
    assert np.array_equal(y, x * 2)
    assert np.allclose(out["s"]["data"], x.sum(axis=1), rtol=1e-5)


def test_binary_output_default_parameter(client: httpx.Client) -> None:
    x = np.ones((2, 4), np.float32)
    r = client.post("/v2/models/affine/infer",
                    json=infer_body(x, parameters={"binary_data_output": True}))
    n = int(r.headers["inference-header-content-length"])
    sizes = [o["parameters"]["binary_data_size"] for o in orjson.loads(r.content[:n])["outputs"]]
    assert sizes == [32, 8] and len(r.content) == n + 40


# ------------------------------------------------------------------------ errors
def _error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    message = r.json()["error"]
    for word in words:
        assert word in message, message


def test_malformed_json(client: httpx.Client) -> None:
    r = client.post("/v2/models/affine/infer", content=b'{"inputs": [')
    _error(r, 400, "not valid JSON")
    _error(client.post("/v2/models/affine/infer", content=b"[1,2]"), 400, "JSON object")
    _error(client.post("/v2/models/affine/infer", json={"inputs": []}), 400, "non-empty")
    _error(client.post("/v2/models/affine/infer", json={"inputs": [{"name": "x"}]}), 400,
           "datatype")


def test_unknown_model_and_version(client: httpx.Client) -> None:
    x = np.ones((1, 4), np.float32)
    r = client.post("/v2/models/nope/infer", json=infer_body(x))
    _error(r, 404, "nope", "not served")
    assert r.json()["code"] == "model_not_found"
    r = client.post("/v2/models/affine/versions/9/infer", json=infer_body(x))
    _error(r, 404, "no version 9")
    assert r.json()["code"] == "version_not_found"
    _error(client.get("/v2/models/nope"), 404, "nope")
    _error(client.get("/v2/models/nope/ready"), 404, "nope")
    _error(client.get("/v2/models/affine/versions/9/ready"), 404, "no version 9")


def test_wrong_shape_dtype_name(client: httpx.Client) -> None:
    _error(client.post("/v2/models/affine/infer", json=infer_body(np.ones((1, 3), np.float32))),
           400, "shape")
    _error(client.post("/v2/models/affine/infer",
                       json=infer_body(np.ones((1, 4), np.float32), datatype="FP64")),
           400, "declared FP64", "expects FP32")
    _error(client.post("/v2/models/affine/infer",
                       json=infer_body(np.ones((1, 4), np.float32), name="z")), 400, "z")
    body = infer_body(np.ones((1, 4), np.float32))
    body["inputs"][0]["shape"] = [2, 4]
    _error(client.post("/v2/models/affine/infer", json=body), 400, "4 values", "[2, 4]")
    _error(client.post("/v2/models/affine/infer",
                       json=infer_body(np.ones((1, 4), np.float32), outputs=[{"name": "q"}])),
           400, "no output 'q'")


def test_bytes_where_numbers_expected(client: httpx.Client) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                        "data": ["a", "b", "c", "d"]}]}
    _error(client.post("/v2/models/affine/infer", json=body), 400, "strings")
    body["inputs"][0]["datatype"] = "BYTES"
    _error(client.post("/v2/models/affine/infer", json=body), 400, "declared BYTES")
    ragged = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                          "data": [[1, 2, 3, 4], [1, 2]]}]}
    _error(client.post("/v2/models/affine/infer", json=ragged), 400, "rectangular")


def test_nan_where_not_allowed(client: httpx.Client) -> None:
    x = np.ones((1, 4), np.float32)
    x[0, 2] = np.nan
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 16}}]})
    r = client.post("/v2/models/affine/infer", content=head + x.tobytes(),
                    headers={"Inference-Header-Content-Length": str(len(head))})
    _error(r, 400, "NaN")
    # The identity models allow missing values: NaN passes through.
    head3 = head.replace(b"[1,4]", b"[1,3]").replace(b":16", b":12")
    r = client.post("/v2/models/id_fp32/infer", content=head3 + x[:, :3].tobytes(),
                    headers={"Inference-Header-Content-Length": str(len(head3))})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"][2] is None  # JSON has no NaN: null (docs/protocol.md)


def test_binary_errors(client: httpx.Client) -> None:
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 16}}]})
    r = client.post("/v2/models/affine/infer", content=head + b"\0" * 8,
                    headers={"Inference-Header-Content-Length": str(len(head))})
    _error(r, 400, "overruns")
    r = client.post("/v2/models/affine/infer", content=head + b"\0" * 20,
                    headers={"Inference-Header-Content-Length": str(len(head))})
    _error(r, 400, "no input claims")
    r = client.post("/v2/models/affine/infer", content=head,
                    headers={"Inference-Header-Content-Length": "99999"})
    _error(r, 400, "Inference-Header-Content-Length")


def test_oversized_body(client: httpx.Client) -> None:
    x = np.ones((MAX_BODY // 16 + 1, 4), np.float32)
    r = client.post("/v2/models/affine/infer", content=x.tobytes())
    _error(r, 413, "max_body_bytes")
    assert r.json()["code"] == "payload_too_large"


def test_bad_budget_and_priority_headers(client: httpx.Client) -> None:
    body = infer_body(np.ones((1, 4), np.float32))
    _error(client.post("/v2/models/affine/infer", json=body,
                       headers={"x-redline-budget-ms": "soon"}), 400, "budget")
    _error(client.post("/v2/models/affine/infer", json=body,
                       headers={"x-redline-priority": "urgent"}), 400, "priority")
    r = client.post("/v2/models/affine/infer", json=body,
                    headers={"x-redline-budget-ms": "500", "x-redline-priority": "high"})
    assert r.status_code == 200


def test_routing_errors(client: httpx.Client) -> None:
    _error(client.get("/v3/anything"), 404, "no route")
    r = client.get("/v2/models/affine/infer")
    _error(r, 405, "POST")
    _error(client.post("/v2/models/affine/extra/infer", json={}), 404)


def test_admin_surface(client: httpx.Client) -> None:
    _error(client.post("/v2/repository/index"), 401, "Bearer")
    _error(client.post("/v2/repository/index", headers={"Authorization": "Bearer wrong"}), 401)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    index = client.post("/v2/repository/index", headers=auth).json()
    assert {"name": "affine", "version": "1", "state": "READY"} in index
    assert client.post("/v2/repository/models/id_int8/unload", headers=auth).status_code == 200
    r = client.post("/v2/models/id_int8/infer",
                    json=infer_body(np.ones((1, 3), np.int8), datatype="INT8"))
    _error(r, 503, "unloaded")
    assert client.get("/v2/models/id_int8/ready").status_code == 503
    assert client.post("/v2/repository/models/id_int8/load", headers=auth).status_code == 200
    r = client.post("/v2/models/id_int8/infer",
                    json=infer_body(np.ones((1, 3), np.int8), datatype="INT8"))
    assert r.status_code == 200
    _error(client.post("/v2/repository/models/nope/load", headers=auth), 404)


def test_bytes_wire_format_roundtrip(client: httpx.Client) -> None:
    words = ["héllo", "", "x" * 300]
    raw = b"".join(struct.pack("<I", len(w.encode())) + w.encode() for w in words)
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "parameters": {"binary_data_output": True}})
    r = client.post("/v2/models/id_bytes/infer", content=head + raw,
                    headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.text
    n = int(r.headers["inference-header-content-length"])
    assert r.content[n:] == raw


def test_huge_finite_values_are_not_mistaken_for_nan(client: httpx.Client) -> None:
    x = np.array([[3e38, -3e38, 1e-38, 7.0]], np.float32)
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 16}}],
                         "outputs": [{"name": "s"}]})
    r = client.post("/v2/models/affine/infer", content=head + x.tobytes(),
                    headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.text
    r = client.post("/v2/models/affine/infer", json=infer_body(x.astype(np.float64)))
    assert r.status_code == 200, r.text
