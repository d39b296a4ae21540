"""The gRPC hot path's hand-written wire bytes equal what the protobuf API builds.

``grpc_wire.infer_response`` writes a ``ModelInferResponse`` without protobuf objects, and
``decode_grpc`` reads packed FP32/FP64 contents from their wire bytes; both are held here to the
protobuf API's own answer over random tensors of every datatype, shape and value range.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from redline.errors import InvalidInput
from redline.models.datatypes import array_to_wire, v2_datatype
from redline.proto import grpc_service_pb2 as pb
from redline.serving.grpc_wire import infer_response, serialize, varint
from redline.serving.protocol import GRPC_CONTENTS_FIELD, decode_grpc

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64]


def reference(model: str, version: str, request_id: str | None,
              outputs: dict[str, np.ndarray], raw: bool) -> Any:
    """The response as the protobuf API builds it (the servicer's code before grpc_wire)."""
    resp = pb.ModelInferResponse(model_name=model, model_version=version)
    if request_id is not None:
        resp.id = request_id
    raw = raw or any(a.dtype == np.float16 for a in outputs.values())
    for name, array in outputs.items():
        datatype = v2_datatype(array.dtype)
        tensor = resp.outputs.add()
        tensor.name = name
        tensor.datatype = datatype
        tensor.shape.extend(array.shape)
        if raw:
            resp.raw_output_contents.append(array_to_wire(array))
        elif datatype == "BYTES":
            tensor.contents.bytes_contents.extend(
                x if isinstance(x, bytes) else str(x).encode("utf-8") for x in array.ravel())
        else:
            getattr(tensor.contents, GRPC_CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
    return resp


@st.composite
def tensors(draw: st.DrawFn) -> np.ndarray:
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40))
    if draw(st.integers(0, 9)) == 0:
        return np.array(draw(st.lists(st.text(max_size=5), min_size=1, max_size=4)), dtype=object)
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    if dtype.kind in "iu" and draw(st.booleans()):  # labels: the one-byte fast path
        elements = st.integers(0, 127)
        return draw(hnp.arrays(dtype, shape, elements=elements))
    return draw(hnp.arrays(dtype, shape))


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(outputs=st.dictionaries(st.text(min_size=1, max_size=8), tensors(), min_size=1,
                               max_size=3),
       raw=st.booleans(), model=st.text(min_size=1, max_size=20), version=st.text(max_size=4),
       request_id=st.one_of(st.none(), st.text(max_size=30)))
def test_response_bytes_parse_to_the_protobuf_apis_message(
        outputs: dict[str, np.ndarray], raw: bool, model: str, version: str,
        request_id: str | None) -> None:
    wire = infer_response(model, version, request_id, outputs, raw)
    expected = reference(model, version, request_id, outputs, raw)
    parsed = pb.ModelInferResponse.FromString(wire)
    # NaN != NaN in message equality: compare the canonical serializations instead
    assert parsed.SerializeToString(deterministic=True) == \
        expected.SerializeToString(deterministic=True)


def test_serializer_passes_bytes_and_serializes_messages() -> None:
    message = pb.ServerLiveResponse(live=True)
    assert serialize(message) == message.SerializeToString()
    assert serialize(b"\x08\x01") == b"\x08\x01"


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**31, 2**63 - 1, 2**64 - 1])
def test_varint_is_protobufs(n: int) -> None:
    field = pb.InferTensorContents(uint64_contents=[n]).SerializeToString()
    # key, length, then the one packed varint
    assert field[2:] == varint(n)


def typed_request(array: np.ndarray, datatype: str) -> Any:
    req = pb.ModelInferRequest(model_name="m")
    tensor = req.inputs.add(name="x", datatype=datatype, shape=list(array.shape))
    getattr(tensor.contents, GRPC_CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
    return pb.ModelInferRequest.FromString(req.SerializeToString())


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float32, np.float64]),
                  hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=70)))
def test_typed_float_contents_decode_bit_for_bit(array: np.ndarray) -> None:
    datatype = "FP32" if array.dtype == np.float32 else "FP64"
    decoded = decode_grpc(typed_request(array, datatype)).inputs["x"]
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    assert decoded.tobytes() == array.tobytes()  # NaN payloads and -0.0 included


def test_typed_data_in_another_field_is_refused_by_name() -> None:
    req = typed_request(np.arange(3, dtype=np.int64), "INT64")
    req.inputs[0].datatype = "FP32"
    with pytest.raises(InvalidInput, match="declared FP32 but its data is in 'int64_contents'"):
        decode_grpc(req)
    both = typed_request(np.ones(3, np.float32), "FP32")
    both.inputs[0].contents.fp64_contents.extend([1.0])
    with pytest.raises(InvalidInput, match="its data is in 'fp64_contents'"):
        decode_grpc(both)


def test_typed_float_contents_count_must_match_shape() -> None:
    req = typed_request(np.ones(6, np.float32), "FP32")
    del req.inputs[0].shape[:]
    req.inputs[0].shape.extend([2, 4])
    with pytest.raises(InvalidInput, match="6 values but its shape"):
        decode_grpc(req)


def test_unpacked_float_contents_decode_as_packed_ones() -> None:
    """A client may send a repeated float unpacked (one key per element; parsers must accept
    it): the packed-bytes read still sees every value, in order."""
    values = np.array([1.5, -0.0, np.inf, 3.25, np.nan, 7.0], np.float32)
    unpacked = b"".join(b"\x35" + v.tobytes() for v in values)  # field 6, wire type 5
    contents = pb.InferTensorContents.FromString(unpacked)
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[2, 3]).contents.CopyFrom(contents)
    decoded = decode_grpc(pb.ModelInferRequest.FromString(req.SerializeToString())).inputs["x"]
    assert decoded.tobytes() == values.reshape(2, 3).tobytes()


def test_unknown_fields_in_contents_do_not_shift_the_values() -> None:
    """Fields this schema does not know (a newer client's) arrive before the floats here."""
    values = np.array([0.5, 2.0, -3.0], np.float32)
    wire = b"\xa0\x01\x07" + b"\x32\x0c" + values.tobytes()  # field 20 = 7, then fp32_contents
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 3]).contents.MergeFromString(wire)
    decoded = decode_grpc(pb.ModelInferRequest.FromString(req.SerializeToString())).inputs["x"]
    assert decoded.tobytes() == values.reshape(1, 3).tobytes()
