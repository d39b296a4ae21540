"""Every V2 datatype round-trips exactly through Identity models on every transport and encoding."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import orjson
import pytest

from redline.models.datatypes import array_to_wire
from redline.proto import grpc_service_pb2 as pb
from redline.proto import grpc_service_pb2_grpc as pbg
from redline.serving.protocol import GRPC_CONTENTS_FIELD
from tests.serving.helpers import ALL_DATATYPES, ServerThread

NUMPY = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
         "INT64": np.int64, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
         "UINT64": np.uint64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


def sample(datatype: str, rows: int = 2) -> np.ndarray:
    """Values that catch truncation and sign errors: the type's extremes and ordinary values."""
    if datatype == "BYTES":
        return np.array([["a", "ünïcode", ""], ["x" * 40, "7", "z"]][:rows], dtype=object)
    dtype = np.dtype(NUMPY[datatype])
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]][:rows])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 1], [0, 7, info.max - 1]][:rows], dtype=dtype)
    info = np.finfo(dtype)
    return np.array([[info.max, -1.5, 0.1], [info.tiny, 3.25, -0.0]][:rows], dtype=dtype)


def _decode_json_output(out: dict, datatype: str) -> np.ndarray:  # type: ignore[type-arg]
    if datatype == "BYTES":
        return np.array(out["data"], dtype=object).reshape(out["shape"])
    return np.array(out["data"], dtype=NUMPY[datatype]).reshape(out["shape"])


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_rest_json(served: ServerThread, datatype: str) -> None:
    x = sample(datatype)
    data = x.tolist() if datatype != "FP16" else x.astype(np.float32).tolist()
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": datatype, "data": data}]}
    r = httpx.post(f"{served.http}/v2/models/id_{datatype.lower()}/infer",
                   content=orjson.dumps(body), timeout=10)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["datatype"] == datatype and out["shape"] == [2, 3]
    assert np.array_equal(_decode_json_output(out, datatype), x)


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_rest_binary(served: ServerThread, datatype: str) -> None:
    x = sample(datatype)
    raw = array_to_wire(x)
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": datatype,
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}]})
    r = httpx.post(f"{served.http}/v2/models/id_{datatype.lower()}/infer", content=head + raw,
                   headers={"Inference-Header-Content-Length": str(len(head))}, timeout=10)
    assert r.status_code == 200, r.text
    n = int(r.headers["inference-header-content-length"])
    assert r.content[n:] == raw


@pytest.fixture(scope="module")
def stub(served: ServerThread):  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(served.grpc) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_grpc_raw(stub, datatype: str) -> None:  # type: ignore[no-untyped-def]
    x = sample(datatype)
    req = pb.ModelInferRequest(model_name=f"id_{datatype.lower()}", id="r1")
    req.inputs.add(name="x", datatype=datatype, shape=[2, 3])
    req.raw_input_contents.append(array_to_wire(x))
    resp = stub.ModelInfer(req, timeout=10)
    assert resp.id == "r1" and resp.outputs[0].datatype == datatype
    assert list(resp.outputs[0].shape) == [2, 3]
    assert resp.raw_output_contents[0] == array_to_wire(x)


@pytest.mark.parametrize("datatype", [d for d in ALL_DATATYPES if d != "FP16"])
def test_grpc_typed_contents(stub, datatype: str) -> None:  # type: ignore[no-untyped-def]
    x = sample(datatype)
    req = pb.ModelInferRequest(model_name=f"id_{datatype.lower()}")
    tensor = req.inputs.add(name="x", datatype=datatype, shape=[2, 3])
    field = GRPC_CONTENTS_FIELD[datatype]
    values = [v.encode() for v in x.ravel()] if datatype == "BYTES" else x.ravel().tolist()
    getattr(tensor.contents, field).extend(values)
    resp = stub.ModelInfer(req, timeout=10)
    assert not resp.raw_output_contents  # typed in, typed out
    got = list(getattr(resp.outputs[0].contents, field))
    assert got == values
