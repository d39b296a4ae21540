"""Triton's own clients (tritonclient.http and tritonclient.grpc) work unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.serving.helpers import ALL_DATATYPES, ServerThread
from tests.serving.test_datatypes import sample


@pytest.fixture(scope="module")
def http_client(served: ServerThread):  # type: ignore[no-untyped-def]
    client = thttp.InferenceServerClient(served.http.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(served: ServerThread):  # type: ignore[no-untyped-def]
    client = tgrpc.InferenceServerClient(served.grpc)
    yield client
    client.close()


def test_http_health_and_metadata(http_client) -> None:  # type: ignore[no-untyped-def]
    assert http_client.is_server_live() and http_client.is_server_ready()
    assert http_client.is_model_ready("affine")
    assert http_client.get_server_metadata()["name"] == "redline"
    meta = http_client.get_model_metadata("affine")
    assert meta["inputs"][0]["name"] == "x"
    assert http_client.get_model_config("affine")["max_batch_size"] == 32


def test_grpc_health_and_metadata(grpc_client) -> None:  # type: ignore[no-untyped-def]
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    assert grpc_client.is_model_ready("affine")
    assert grpc_client.get_server_metadata().name == "redline"
    assert grpc_client.get_model_metadata("affine").inputs[0].name == "x"


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_http_infer_every_datatype(http_client, datatype: str, binary: bool) -> None:  # type: ignore[no-untyped-def]
    x = sample(datatype)
    inp = thttp.InferInput("x", list(x.shape), datatype)
    inp.set_data_from_numpy(x, binary_data=binary)
    out = thttp.InferRequestedOutput("y", binary_data=binary)
    result = http_client.infer(f"id_{datatype.lower()}", [inp], outputs=[out], request_id="q1")
    y = result.as_numpy("y")
    if datatype == "BYTES":
        y = np.array([v.decode() if isinstance(v, bytes) else v for v in y.ravel()],
                     dtype=object).reshape(y.shape)
    assert np.array_equal(y, x)
    assert result.get_response()["id"] == "q1"


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_grpc_infer_every_datatype(grpc_client, datatype: str) -> None:  # type: ignore[no-untyped-def]
    x = sample(datatype)
    inp = tgrpc.InferInput("x", list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    result = grpc_client.infer(f"id_{datatype.lower()}", [inp])
    y = result.as_numpy("y")
    if datatype == "BYTES":
        y = np.array([v.decode() for v in y.ravel()], dtype=object).reshape(y.shape)
    assert np.array_equal(y, x)


def test_errors_surface_as_triton_exceptions(http_client, grpc_client) -> None:  # type: ignore[no-untyped-def]
    x = np.ones((1, 3), np.float32)
    for client, module in ((http_client, thttp), (grpc_client, tgrpc)):
        inp = module.InferInput("x", [1, 3], "FP32")
        inp.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as info:
            client.infer("affine", [inp])
        assert "shape" in str(info.value)
        with pytest.raises(InferenceServerException):
            client.infer("nope", [inp])
