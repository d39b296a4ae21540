"""Every gRPC method and error status, with grpcio against the real server."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from redline.proto import grpc_service_pb2 as pb
from redline.proto import grpc_service_pb2_grpc as pbg
from tests.serving.helpers import ServerThread


@pytest.fixture(scope="module")
def stub(served: ServerThread):  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(served.grpc) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def affine_request(x: np.ndarray, name: str = "x", datatype: str = "FP32") -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="affine")
    req.inputs.add(name=name, datatype=datatype, shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


def test_server_methods(stub) -> None:  # type: ignore[no-untyped-def]
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    meta = stub.ServerMetadata(pb.ServerMetadataRequest())
    assert meta.name == "redline" and "binary_tensor_data" in meta.extensions


def test_model_methods(stub) -> None:  # type: ignore[no-untyped-def]
    assert stub.ModelReady(pb.ModelReadyRequest(name="affine")).ready
    assert stub.ModelReady(pb.ModelReadyRequest(name="affine", version="1")).ready
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="affine"))
    assert meta.name == "affine" and list(meta.versions) == ["1"]
    assert meta.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [-1, 4])]
    assert [t.name for t in meta.outputs] == ["y", "s"]


def test_infer_raw_and_outputs(stub) -> None:  # type: ignore[no-untyped-def]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    req = affine_request(x)
    req.id = "abc"
    resp = stub.ModelInfer(req, timeout=10)
    assert resp.model_name == "affine" and resp.model_version == "1" and resp.id == "abc"
    y = np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(list(resp.outputs[0].shape))
    assert np.array_equal(y, x * 2)
    req.outputs.add(name="s")
    resp = stub.ModelInfer(req, timeout=10)
    assert [o.name for o in resp.outputs] == ["s"] and len(resp.raw_output_contents) == 1
    assert np.allclose(np.frombuffer(resp.raw_output_contents[0], "<f4"), x.sum(axis=1))


def test_infer_typed_contents(stub) -> None:  # type: ignore[no-untyped-def]
    req = pb.ModelInferRequest(model_name="affine", model_version="1")
    t = req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    t.contents.fp32_contents.extend([1, 2, 3, 4])
    resp = stub.ModelInfer(req, timeout=10)
    assert list(resp.outputs[0].contents.fp32_contents) == [2, 4, 6, 8]


def _status(stub, req, code: grpc.StatusCode, *words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req, timeout=10)
    assert info.value.code() == code, info.value.details()
    for word in words:
        assert word in info.value.details()


def test_errors(stub) -> None:  # type: ignore[no-untyped-def]
    x = np.ones((1, 4), np.float32)
    req = affine_request(x)
    req.model_name = "nope"
    _status(stub, req, grpc.StatusCode.NOT_FOUND, "nope")
    req = affine_request(x)
    req.model_version = "9"
    _status(stub, req, grpc.StatusCode.NOT_FOUND, "no version 9")
    _status(stub, affine_request(np.ones((1, 3), np.float32)), grpc.StatusCode.INVALID_ARGUMENT,
            "shape")
    _status(stub, affine_request(x, name="z"), grpc.StatusCode.INVALID_ARGUMENT, "z")
    _status(stub, affine_request(x.astype(np.float64), datatype="FP64"),
            grpc.StatusCode.INVALID_ARGUMENT, "FP64")
    nan = x.copy()
    nan[0, 0] = np.nan
    _status(stub, affine_request(nan), grpc.StatusCode.INVALID_ARGUMENT, "NaN")
    req = affine_request(x)
    req.raw_input_contents[0] = b"\0" * 5
    _status(stub, req, grpc.StatusCode.INVALID_ARGUMENT, "raw bytes")
    req = pb.ModelInferRequest(model_name="affine")
    t = req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    t.contents.bytes_contents.extend([b"a", b"b", b"c", b"d"])
    _status(stub, req, grpc.StatusCode.INVALID_ARGUMENT, "bytes_contents")
    req = affine_request(x)
    req.outputs.add(name="q")
    _status(stub, req, grpc.StatusCode.INVALID_ARGUMENT, "no output 'q'")
    _status(stub, pb.ModelInferRequest(model_name="affine"), grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelReady(pb.ModelReadyRequest(name="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_oversized_message(stub) -> None:  # type: ignore[no-untyped-def]
    from tests.serving.conftest import MAX_BODY

    big = np.ones((MAX_BODY // 16 + 1, 4), np.float32)
    _status(stub, affine_request(big), grpc.StatusCode.RESOURCE_EXHAUSTED)
