"""Hostile and careless clients on the V2 API: one Budget, observers.

Each case is a clear 4xx with the JSON error body (INVALID_ARGUMENT and friends on gRPC), never
a 5xx, an UNKNOWN, a silent coercion or a wrong status.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest

from redline.config import Settings
from redline.models import ModelRepository
from redline.proto import grpc_service_pb2 as pb
from redline.proto import grpc_service_pb2_grpc as pbg
from redline.serving.observers import RequestObserver
from redline.serving.stages import RequestRecord
from tests.serving.conftest import ADMIN_TOKEN
from tests.serving.helpers import ServerThread, affine_model

BAD_BUDGETS = ["-5", "0", "-inf", "inf", "nan", "1e12", "abc", "²"]


def _infer_body(data: object, **extra: object) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                     "data": data}], **extra})


def _json_error(r: httpx.Response, status: int) -> dict[str, str]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["error"] and doc["code"]
    return doc


def test_deep_nesting_is_a_400_not_a_500(served: ServerThread) -> None:
    """JSON nested ~1,000 deep (under orjson's own limit) in id, parameters, BYTES data."""
    deep = b"[" * 1000 + b"1.0" + b"]" * 1000
    deep_str = b"[" * 1000 + b'"a"' + b"]" * 1000
    head = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": '
    bodies = [
        head + b'[1, 2, 3, 4]}], "id": ' + deep + b"}",
        head + b'[1, 2, 3, 4]}], "parameters": {"priority": ' + deep + b"}}",
        head + deep + b"}]}",
    ]
    with httpx.Client(base_url=served.http, timeout=30) as c:
        for body in bodies:
            _json_error(c.post("/v2/models/affine/infer", content=body), 400)
        r = c.post("/v2/models/id_bytes/infer",
                   content=b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 3], '
                           b'"data": ' + deep_str + b"}]}")
        _json_error(r, 400)


def test_unicode_digit_versions_are_not_found_on_both_transports(served: ServerThread) -> None:
    """Versions such as '²' and '①' pass ``str.isdigit()`` but are no number: a 4xx and
    NOT_FOUND, never a 500 / UNKNOWN from ``int()``."""
    with httpx.Client(base_url=served.http, timeout=10) as c:
        for version in ("²", "①", "٣"):
            r = c.post(f"/v2/models/affine/versions/{version}/infer",
                       content=_infer_body([1, 2, 3, 4]))
            assert r.status_code in (400, 404), r.text
            _json_error(r, r.status_code)
            _json_error(c.get(f"/v2/models/affine/versions/{version}"), 404)
    with grpc.insecure_channel(served.grpc) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="affine", version="①"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("data", [
    [17.99, "10.38", 3, 4], [17.99, True, 3, 4], [1.0, None, 3, 4], [None, 1.0, 3, 4],
    [1e39, 2, 3, 4], [[1.0, 2.0], "x"],
])
def test_float_data_is_never_coerced(served: ServerThread, data: list[object]) -> None:
    """Strings, booleans and null in FP32 data, and values beyond FP32's range, are 400s,
    whether or not the model allows missing values and whatever the first element is."""
    with httpx.Client(base_url=served.http, timeout=10) as c:
        for model, width in (("affine", 4), ("id_fp32", 3)):  # rejects / allows missing values
            row = (data + [1.0] * width)[:width] if not isinstance(data[0], list) else data
            body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32",
                                             "shape": [1, width], "data": row}]})
            _json_error(c.post(f"/v2/models/{model}/infer", content=body), 400)


def test_grpc_undecodable_and_doubly_typed_messages_are_invalid_argument(
        served: ServerThread) -> None:
    """An undecodable message, or raw and typed contents together, is INVALID_ARGUMENT, never
    UNKNOWN or the typed data silently ignored."""
    with grpc.insecure_channel(served.grpc) as channel:
        raw_call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as err:
            raw_call(b"\xff\xff\xff\xff garbage")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid" in (err.value.details() or "")
        stub = pbg.GRPCInferenceServiceStub(channel)
        x = np.ones((1, 4), np.float32)
        req = pb.ModelInferRequest(model_name="affine", raw_input_contents=[x.tobytes()])
        tensor = req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend([9.0, 9.0, 9.0, 9.0])
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(req)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "both raw_input_contents and typed contents" in (err.value.details() or "")


@pytest.mark.parametrize("raw", [
    b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
    b"Content-Length: 5\r\n\r\nabc",
    b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nabc\r\n0\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
    b"FROB /v2 HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_http_framing_errors_get_the_json_error_body(served: ServerThread, raw: bytes) -> None:
    """Malformed HTTP gets redline's JSON error body, not uvicorn's own text/plain answer."""
    with socket.create_connection(("127.0.0.1", served.server.http_port), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), data
    assert b"content-type: application/json" in head.lower()
    doc = orjson.loads(body)
    assert doc["code"] == "bad_request" and "malformed HTTP request" in doc["error"]


def test_admin_routes_do_not_exist_when_admin_is_off(tmp_path: Path) -> None:
    """With admin off, an admin route does not exist for any method: no 405 with
    ``Allow: POST`` that would reveal it."""
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    settings = Settings()
    settings.server.watch_repository = False
    settings.runtime.warmup_batch_sizes = [1]
    server = ServerThread(settings, repo).start()
    try:
        with httpx.Client(base_url=server.http, timeout=10) as c:
            for method in ("GET", "POST"):
                for path in ("/v2/repository/index", "/v2/repository/models/affine/load"):
                    r = c.request(method, path)
                    assert r.status_code == 404 and "allow" not in r.headers, r.text
    finally:
        server.stop()


def test_admin_load_of_an_impossible_name_is_a_400(served: ServerThread) -> None:
    """A 300-character name is refused before it reaches the filesystem (ENAMETOOLONG would be
    a 500)."""
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=served.http, timeout=10, headers=auth) as c:
        for name in ("a" * 300, "bad name!", "-x"):
            doc = _json_error(c.post(f"/v2/repository/models/{name}/load"), 400)
            assert "invalid model name" in doc["error"]


@pytest.mark.allow_log(r"does not match its recorded sha256")
def test_a_tampered_latest_version_does_not_take_the_model_down(tmp_path: Path) -> None:
    """Under ``latest: 1`` a corrupt newest version does not leave nothing loaded: the newest
    intact earlier version serves, and the index says why the latest does not."""
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("m", affine_model(scale=2.0))
    repo.add_onnx("m", affine_model(scale=3.0))
    model_file = repo.version_dir("m", 2) / "model.onnx"
    model_file.write_bytes(model_file.read_bytes()[:-16] + b"\0" * 16)  # sha256 no longer matches
    settings = Settings()
    settings.server.watch_repository = False
    settings.server.admin_enabled = True
    settings.server.admin_token = ADMIN_TOKEN
    settings.runtime.warmup_batch_sizes = [1]
    server = ServerThread(settings, repo).start()
    try:
        with httpx.Client(base_url=server.http, timeout=10) as c:
            r = c.post("/v2/models/m/infer", content=_infer_body([1, 2, 3, 4]))
            assert r.status_code == 200, r.text
            assert r.json()["model_version"] == "1"
            assert r.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
            index = c.post("/v2/repository/index",
                           headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
        states = {row["version"]: row for row in index}
        assert states["1"]["state"] == "READY"
        assert states["2"]["state"] == "UNAVAILABLE" and "sha256" in states["2"]["reason"]
    finally:
        server.stop()
    shutil.rmtree(tmp_path / "repo")


def test_bad_budgets_are_the_same_400_on_rest_and_invalid_argument_on_grpc(
        served: ServerThread) -> None:
    """One ``parse_budget``: the same values refused the same way, naming where they came from."""
    x = np.ones((1, 4), np.float32)
    with httpx.Client(base_url=served.http, timeout=10) as c, \
            grpc.insecure_channel(served.grpc) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        req = pb.ModelInferRequest(model_name="affine", raw_input_contents=[x.tobytes()])
        req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        for value in BAD_BUDGETS:
            for body in (_infer_body([1, 2, 3, 4]), _infer_body([1, 2, 3, 4], parameters={})):
                r = c.post("/v2/models/affine/infer", content=body,
                           headers={b"x-redline-budget-ms": value.encode()})
                doc = _json_error(r, 400)
                assert doc["code"] == "invalid_input" and "x-redline-budget-ms" in doc["error"]
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(req, metadata=(("x-redline-budget-ms", value
                                                if value.isascii() else "2e"),))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, value
            assert "metadata x-redline-budget-ms" in (err.value.details() or "")
        ok = c.post("/v2/models/affine/infer", content=_infer_body([1, 2, 3, 4]),
                    headers={"x-redline-budget-ms": "250"})
        assert ok.status_code == 200


class _Keep(RequestObserver):
    """An observer that keeps every record it is handed."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def request_finished(self, record: RequestRecord) -> None:
        self.records.append(record)


def test_observers_get_a_record_of_every_v2_request(tmp_path: Path) -> None:
    """Both transports hand a RequestRecord with the named stages (and the W3C traceparent the
    client sent) to every observer after each request, errors included."""
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    settings = Settings()
    settings.server.watch_repository = False
    settings.runtime.warmup_batch_sizes = [1]
    server = ServerThread(settings, repo)
    keep = _Keep()
    server.server.observers.add(keep)
    server.start()
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    try:
        with httpx.Client(base_url=server.http, timeout=10) as c:
            assert c.post("/v2/models/affine/infer", content=_infer_body([1, 2, 3, 4]),
                          headers={"traceparent": trace}).status_code == 200
            assert c.post("/v2/models/affine/infer", content=_infer_body([1, 2, "x", 4])
                          ).status_code == 400
        with grpc.insecure_channel(server.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            x = np.ones((1, 4), np.float32)
            req = pb.ModelInferRequest(model_name="affine", raw_input_contents=[x.tobytes()])
            req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
            stub.ModelInfer(req, metadata=(("traceparent", trace),))
    finally:
        server.stop()
    rest_ok, rest_bad, grpc_ok = keep.records
    for rec, transport in ((rest_ok, "rest"), (grpc_ok, "grpc")):
        assert (rec.api, rec.transport, rec.model, rec.status) == ("v2", transport, "affine", "ok")
        assert rec.traceparent == trace
        stages = [s for s, _, _ in rec.spans]
        assert stages[0] == "decode" and "inference" in stages and stages[-1] == "encode"
        assert all(start <= end for _, start, end in rec.spans)
        assert rec.end_ns >= rec.spans[-1][2]
    assert rest_bad.status == "invalid_input"
