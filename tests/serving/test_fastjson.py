"""The REST JSON fast path (serving/fastjson.py): same answers as the general path, and every
request it does not recognise — errors included — answered by the general path."""

from __future__ import annotations

import httpx
import numpy as np
import orjson
import pytest

from redline.errors import InvalidInput
from redline.models import TensorSpec
from redline.serving.fastjson import JsonFastPath
from redline.serving.protocol import decode_rest
from tests.serving.helpers import ServerThread

X = TensorSpec("x", "FP32", [-1, 4])
OUTS = [TensorSpec("y", "FP32", [-1, 4]), TensorSpec("s", "FP32", [-1])]


@pytest.fixture(scope="module")
def client(served: ServerThread):  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=served.http, timeout=30) as c:
        yield c


def flat_body(x: np.ndarray, **extra: object) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                     "data": x.ravel().tolist()}], **extra})


def test_applies_only_to_one_batched_float_input() -> None:
    assert JsonFastPath.for_model([X], OUTS, "m", "1", True) is not None
    assert JsonFastPath.for_model([X, X], OUTS, "m", "1", True) is None
    assert JsonFastPath.for_model([TensorSpec("x", "INT64", [-1, 4])], OUTS, "m", "1", True) is None
    assert JsonFastPath.for_model([TensorSpec("x", "FP32", [1, 4])], OUTS, "m", "1", True) is None
    assert JsonFastPath.for_model([TensorSpec("x", "FP32", [-1, -1])], OUTS, "m", "1", True) is None
    bytes_out = [TensorSpec("label", "BYTES", [-1])]
    assert JsonFastPath.for_model([X], bytes_out, "m", "1", True) is None


def test_decodes_like_the_general_path() -> None:
    fast = JsonFastPath.for_model([X], OUTS, "m", "1", True)
    assert fast is not None
    rng = np.random.default_rng(3)
    for rows in (1, 2, 7):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        body = flat_body(x, id="r1")
        decoded = fast.decode(body)
        assert decoded is not None
        inputs, n, rid = decoded
        general = decode_rest(body)
        assert n == rows and rid == "r1"
        assert inputs["x"].dtype == np.float32 and inputs["x"].shape == (rows, 4)
        assert np.array_equal(inputs["x"], general.inputs["x"])
    ints = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                     "data": [1, 2, 3, 4]}]})
    decoded = fast.decode(ints)
    assert decoded is not None and decoded[0]["x"].tolist() == [[1.0, 2.0, 3.0, 4.0]]


@pytest.mark.parametrize("body", [
    b'{"inputs": [',                                                        # malformed
    b'{"inputs": []}',                                                      # no input
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [[1, 2, 3, 4]]}]}',
    b'{"inputs": [{"name": "z", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 4], "data": [1, 2, 3, 4]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [1, 2, 3, 4]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [0, 4], "data": []}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": ["a", 2, 3, 4]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [true, 2, 3, 4]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1e39, 2, 3, 4]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],'
    b' "outputs": [{"name": "s"}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],'
    b' "parameters": {"binary_data_output": true}}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4],'
    b' "parameters": {"binary_data_size": 16}}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],'
    b' "id": 7}',
])
def test_declines_what_it_does_not_recognise(body: bytes) -> None:
    fast = JsonFastPath.for_model([X], OUTS, "m", "1", True)
    assert fast is not None
    assert fast.decode(body) is None


def test_overflow_is_declined_even_when_the_model_allows_missing_values() -> None:
    """1e39 is not a missing value; it would become inf in FP32. The fast path declines it
    (the general path answers 400) whatever the model's missing-value policy."""
    fast = JsonFastPath.for_model([X], OUTS, "m", "1", False)
    assert fast is not None
    body = (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],'
            b' "data": [1e39, 2, 3, 4]}]}')
    assert fast.decode(body) is None
    with pytest.raises(InvalidInput, match="outside the range of FP32"):
        decode_rest(body)


def test_same_answer_as_the_general_path_over_http(client: httpx.Client) -> None:
    """A request the fast path takes and the same request routed through the general path
    (an empty ``parameters`` object makes the fast path decline) get the same document."""
    rng = np.random.default_rng(5)
    for rows in (1, 3):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        for extra in ({}, {"id": "abc"}):
            fast = client.post("/v2/models/affine/infer", content=flat_body(x, **extra),
                               headers={"content-type": "application/json"})
            general = client.post("/v2/models/affine/infer",
                                  content=flat_body(x, parameters={}, **extra),
                                  headers={"content-type": "application/json"})
            assert fast.status_code == general.status_code == 200, fast.text
            assert fast.content == general.content
            doc = fast.json()
            assert doc.get("id") == extra.get("id")
            out = {o["name"]: o for o in doc["outputs"]}
            assert np.allclose(np.array(out["y"]["data"]).reshape(rows, 4), x * 2)
            assert out["s"]["shape"] == [rows]


def _error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    message = r.json()["error"]
    for word in words:
        assert word in message, message


def test_flat_requests_with_errors_get_the_general_messages(client: httpx.Client) -> None:
    def post(data: list[object], name: str = "x", datatype: str = "FP32",
             shape: list[int] | None = None) -> httpx.Response:
        body = {"inputs": [{"name": name, "datatype": datatype, "shape": shape or [1, 4],
                            "data": data}]}
        return client.post("/v2/models/affine/infer", content=orjson.dumps(body))

    _error(post([1e39, 2, 3, 4]), 400, "outside the range")  # FP32 overflow: the scan declines
    _error(post([1, 2, 3, 4], name="z"), 400, "z")
    _error(post([1, 2, 3, 4], datatype="FP64"), 400, "FP64", "FP32")
    _error(post([1, 2, 3], shape=[1, 3]), 400)
    _error(post([1, 2, 3, 4], shape=[2, 4]), 400, "4 values")
    _error(post(["a", 2, 3, 4]), 400, "strings")
    r = client.post("/v2/models/nope/infer", content=orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}))
    _error(r, 404, "nope")


def test_encodes_like_the_general_encoder() -> None:
    from redline.serving.protocol import InferRequest, encode_rest

    fast = JsonFastPath.for_model([X], OUTS, "m", "3", True)
    assert fast is not None
    outputs = {"y": np.arange(8, dtype=np.float32).reshape(2, 4),
               "s": np.array([6.0, 22.0], np.float32)}
    for rid in (None, "q"):
        request = InferRequest({}, {})
        request.id = rid
        assert fast.encode(outputs, rid) == encode_rest("m", "3", outputs, request)[0]
    # An output of another dtype than declared, or a missing one: the general encoder answers.
    assert fast.encode({**outputs, "s": outputs["s"].astype(np.float64)}, None) is None
    assert fast.encode({"y": outputs["y"]}, None) is None
