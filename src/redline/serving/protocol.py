"""The Open Inference Protocol v2 codec, shared by the REST app and the gRPC service.

One decoded form, :class:`InferRequest`, whichever transport it came from: tensors are numpy
arrays of the declared V2 datatype. JSON is parsed by orjson straight into Python lists that
numpy turns into one array per input; Triton's binary tensor extension (a JSON header of
``Inference-Header-Content-Length`` bytes followed by raw little-endian tensors) and gRPC's
``raw_input_contents`` skip number parsing entirely via ``np.frombuffer``.

Why the fast path is shaped this way: at one row per request the codec is a large share of the
server's own time, so decode does one ``np.asarray`` per input and encode hands numpy arrays to
``orjson.dumps(OPT_SERIALIZE_NUMPY)`` without ``tolist()``.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from redline.errors import InvalidInput
from redline.models.datatypes import V2_TO_NUMPY, array_to_wire, v2_datatype

_NUMPY_OPT = orjson.OPT_SERIALIZE_NUMPY
_LE = {name: dt.newbyteorder("<") for name, dt in V2_TO_NUMPY.items() if name != "BYTES"}
# Which JSON values may hold each datatype: numpy array kinds.
_ALLOWED_KINDS = {"BOOL": "b"}
for _name in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"):
    _ALLOWED_KINDS[_name] = "iu"
for _name in ("FP16", "FP32", "FP64"):
    _ALLOWED_KINDS[_name] = "iuf"

# gRPC InferTensorContents field per datatype (FP16 has none: it travels raw only).
GRPC_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


_NO_PARAMETERS: dict[str, Any] = {}
# Typed contents whose packed wire form is the array's little-endian bytes (decoded here,
# written by grpc_wire).
PACKED_FIXED: dict[str, np.dtype[Any]] = {"FP32": np.dtype("<f4"), "FP64": np.dtype("<f8")}


class InferRequest:
    """A decoded inference request: the same object whichever transport it arrived on."""

    __slots__ = ("inputs", "datatypes", "id", "parameters", "outputs", "binary_outputs",
                 "binary_default", "raw_outputs")

    def __init__(
        self, inputs: dict[str, np.ndarray], datatypes: dict[str, str], raw_outputs: bool = True
    ) -> None:
        self.inputs = inputs
        self.datatypes = datatypes
        self.id: str | None = None
        self.parameters: dict[str, Any] = _NO_PARAMETERS  # shared while empty: never mutated
        self.outputs: list[str] | None = None  # requested output names; None = all
        self.binary_outputs: set[str] | frozenset[str] = frozenset()  # REST: sent as raw bytes
        self.binary_default = False  # REST: `binary_data_output` request parameter
        self.raw_outputs = raw_outputs  # gRPC: answer with raw_output_contents

    @property
    def rows(self) -> int:
        """The rows the request sent, by its first input (before any check)."""
        first = next(iter(self.inputs.values()), None)
        return int(first.shape[0]) if first is not None and first.ndim else 1


# ---------------------------------------------------------------------------- shared helpers
def array_from_json(name: str, datatype: str, shape: Any, data: Any) -> np.ndarray:
    """A numpy array of ``datatype`` from JSON ``data`` (flat or nested), checked against shape."""
    if datatype == "BYTES":
        return _bytes_from_json(name, shape, data)
    dtype = V2_TO_NUMPY.get(datatype)
    if dtype is None:
        raise InvalidInput(
            f"input '{name}' has unknown datatype {datatype!r}; use one of {sorted(V2_TO_NUMPY)}"
        )
    if dtype.kind == "f" and _all_numbers(data):
        # Fast path (floats, the common case): one conversion straight to the target dtype,
        # only once every value is known to be a JSON number: numpy would also turn "10.38",
        # true and null into floats without a word.
        try:
            array = np.array(data, dtype=dtype)
        except (ValueError, TypeError):
            pass  # ragged rows: the checked path below says so
        else:
            _check_range(name, datatype, array)
            return _reshape(name, array, shape)
    if dtype.kind in "fiu" and not _all_numbers(data):
        raise InvalidInput(
            f"input '{name}' is declared {datatype} but its data holds values that are not "
            "numbers (strings, booleans or null) or rows of unequal length; send numbers"
        )
    try:
        array = np.asarray(data)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(
            f"input '{name}' data is not a rectangular list of numbers ({exc})"
        ) from None
    kind = array.dtype.kind
    if kind in "fO" and dtype.kind in "iu":
        # Integers beyond int64 (UINT64) make numpy guess float64 or object: parse them exactly.
        array = _exact_ints(name, datatype, data, array)
        kind = array.dtype.kind
    if kind not in _ALLOWED_KINDS[datatype]:
        if kind in "USO":
            raise InvalidInput(
                f"input '{name}' is declared {datatype} but its data holds strings or mixed "
                f"values; send numbers (or declare BYTES if the model takes strings)"
            )
        what = {"b": "booleans", "f": "fractional numbers", "i": "integers", "u": "integers"}
        raise InvalidInput(
            f"input '{name}' is declared {datatype} but its data holds "
            f"{what.get(kind, array.dtype.name)}; send {datatype} values"
        )
    if array.dtype != dtype:
        if kind in "iu" and dtype.kind in "iu" and array.size:
            info = np.iinfo(dtype)
            if array.min() < info.min or array.max() > info.max:
                raise InvalidInput(
                    f"input '{name}' has values outside the range of {datatype} "
                    f"[{info.min}, {info.max}]"
                )
        array = array.astype(dtype)
    return _reshape(name, array, shape)


_NUMBER_TYPES = frozenset((float, int))


def _all_numbers(data: Any) -> bool:
    """Whether ``data`` is a (nested) list whose every leaf is a JSON number (not a bool, a
    string or null). ``map(type, ...)`` keeps the scan in C, a small share of a Python loop's
    cost."""
    if type(data) is not list:
        return type(data) in _NUMBER_TYPES
    if not data:
        return False
    if type(data[0]) is not list:
        return set(map(type, data)) <= _NUMBER_TYPES
    return all(type(row) is list and _all_numbers(row) for row in data)


def _check_range(name: str, datatype: str, array: np.ndarray) -> None:
    """A finite JSON number that overflows the datatype (1e39 as FP32) is refused, not inf."""
    if array.dtype.itemsize < 8 and array.size and not np.isfinite(array).all():
        raise InvalidInput(f"input '{name}' has values outside the range of {datatype}")


def _exact_ints(name: str, datatype: str, data: Any, array: np.ndarray) -> np.ndarray:
    flat = np.asarray(data, dtype=object).ravel()
    if not all(type(v) is int for v in flat):
        return array
    try:
        return np.array(data, dtype=V2_TO_NUMPY[datatype])
    except OverflowError:
        raise InvalidInput(f"input '{name}' has values outside the range of {datatype}") from None


def _bytes_from_json(name: str, shape: list[int], data: Any) -> np.ndarray:
    flat = _flatten(data)
    for item in flat:
        if not isinstance(item, str):
            raise InvalidInput(
                f"input '{name}' is declared BYTES but holds {type(item).__name__} values; "
                "send strings"
            )
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return _reshape(name, array, shape)


def _flatten(data: Any) -> list[Any]:
    """Leaves in order, without recursion (a client may nest a thousand levels deep)."""
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    out: list[Any] = []
    stack: list[Any] = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _reshape(name: str, array: np.ndarray, shape: Any) -> np.ndarray:
    if type(shape) is list and array.shape == tuple(shape):
        return array  # the common case: nested data already has the declared shape
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidInput(f"input '{name}' needs 'shape': a list of non-negative integers")
    expected = 1
    for d in shape:
        expected *= d
    if array.size != expected:
        raise InvalidInput(
            f"input '{name}' has {array.size} values but its shape {shape} needs {expected}"
        )
    return array.reshape(shape)


def array_from_bytes(
    name: str, datatype: str, shape: Any, raw: bytes | memoryview
) -> np.ndarray:
    """A numpy array from raw little-endian tensor bytes (binary extension, gRPC raw contents)."""
    if datatype == "BYTES":
        return _reshape(name, _decode_bytes_elements(name, raw), shape)
    dtype = _LE.get(datatype)
    if dtype is None:
        raise InvalidInput(
            f"input '{name}' has unknown datatype {datatype!r}; use one of {sorted(V2_TO_NUMPY)}"
        )
    if len(raw) % dtype.itemsize:
        raise InvalidInput(
            f"input '{name}' has {len(raw)} raw bytes, not a whole number of {datatype} "
            f"elements ({dtype.itemsize} bytes each)"
        )
    array = np.frombuffer(raw, dtype=dtype)
    if datatype == "BOOL" and array.size and array.view(np.uint8).max() > 1:
        raise InvalidInput(f"input '{name}' is BOOL but its raw bytes are not 0 or 1")
    return _reshape(name, array, shape)


def _decode_bytes_elements(name: str, raw: bytes | memoryview) -> np.ndarray:
    """BYTES wire form: each element is a 4-byte little-endian length and that many bytes."""
    view = memoryview(raw)
    items: list[str] = []
    pos, end = 0, len(view)
    while pos < end:
        if pos + 4 > end:
            raise InvalidInput(f"input '{name}': truncated BYTES element length at byte {pos}")
        (length,) = struct.unpack_from("<I", view, pos)
        pos += 4
        if pos + length > end:
            raise InvalidInput(f"input '{name}': BYTES element overruns the data at byte {pos}")
        try:
            items.append(bytes(view[pos : pos + length]).decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidInput(
                f"input '{name}': a BYTES element is not UTF-8 text; ONNX string tensors hold text"
            ) from None
        pos += length
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _require(obj: Any, key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind):
        raise InvalidInput(f"{where} needs '{key}' ({kind.__name__})")
    return value


# ---------------------------------------------------------------------------- REST
def decode_rest(body: bytes, header_length: int | None = None) -> InferRequest:
    """Decode a REST infer body; ``header_length`` is ``Inference-Header-Content-Length``."""
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise InvalidInput(
                f"Inference-Header-Content-Length is {header_length} but the body has "
                f"{len(body)} bytes"
            )
        head, binary = body[:header_length], memoryview(body)[header_length:]
    else:
        head, binary = body, None
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(
            f"request body is not valid JSON ({exc}); send an Open Inference Protocol v2 "
            "object like {\"inputs\": [{\"name\": ..., \"shape\": ..., \"datatype\": ..., "
            "\"data\": ...}]}"
        ) from None
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object with an 'inputs' list")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("request needs 'inputs': a non-empty list of tensors")
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    offset = 0
    for item in raw_inputs:
        if not isinstance(item, dict):
            raise InvalidInput("each entry of 'inputs' must be an object")
        name = item.get("name")
        datatype = item.get("datatype")
        if type(name) is not str or type(datatype) is not str:
            name = _require(item, "name", str, "each input")
            datatype = _require(item, "datatype", str, f"input '{name}'")
        shape = item.get("shape")
        params = item.get("parameters")
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if binary is None:
                raise InvalidInput(
                    f"input '{name}' has binary_data_size but the request has no "
                    "Inference-Header-Content-Length header"
                )
            if type(size) is not int or size < 0 or offset + size > len(binary):
                raise InvalidInput(
                    f"input '{name}' binary_data_size {size} overruns the binary data "
                    f"({len(binary) - offset} bytes left)"
                )
            array = array_from_bytes(name, datatype, shape, binary[offset : offset + size])
            offset += size
        else:
            if "data" not in item:
                raise InvalidInput(f"input '{name}' needs 'data' (or binary_data_size)")
            array = array_from_json(name, datatype, shape, item["data"])
        if name in inputs:
            raise InvalidInput(f"input '{name}' appears twice")
        inputs[name] = array
        datatypes[name] = datatype
    if binary is not None and offset != len(binary):
        raise InvalidInput(
            f"{len(binary) - offset} bytes of binary data follow the JSON header but no input "
            "claims them (binary_data_size)"
        )
    request = InferRequest(inputs, datatypes)
    rid = doc.get("id")
    if rid is not None:
        if not isinstance(rid, str | int | float) or isinstance(rid, bool):
            raise InvalidInput("'id' must be a string")
        request.id = str(rid)
    params = doc.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise InvalidInput("'parameters' must be an object")
    if isinstance(params, dict):
        request.parameters = params
        request.binary_default = bool(params.get("binary_data_output", False))
    outputs = doc.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
        names: list[str] = []
        request.binary_outputs = set()
        for out in outputs:
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise InvalidInput("each entry of 'outputs' needs a 'name'")
            names.append(out["name"])
            oparams = out.get("parameters")
            if isinstance(oparams, dict):
                flag = oparams.get("binary_data")
                if flag is True or (flag is None and request.binary_default):
                    request.binary_outputs.add(out["name"])
            elif request.binary_default:
                request.binary_outputs.add(out["name"])
        request.outputs = names
    return request


def encode_rest(
    model_name: str,
    model_version: str,
    outputs: dict[str, np.ndarray],
    request: InferRequest,
) -> tuple[bytes, int | None]:
    """The REST response body, and the JSON header length when any output is binary."""
    json_outputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    binary_some = bool(request.binary_outputs)
    binary_all = request.binary_default and not binary_some
    for name, array in outputs.items():
        datatype = v2_datatype(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": array.shape}
        if binary_all or (binary_some and name in request.binary_outputs):
            raw = array_to_wire(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif datatype == "BYTES":
            entry["data"] = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                             for x in array.ravel().tolist()]
        elif datatype == "FP16":
            entry["data"] = array.astype(np.float32).ravel()
        else:
            entry["data"] = array.ravel()  # contiguous always; orjson writes it natively
        json_outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        doc["id"] = request.id
    doc["outputs"] = json_outputs
    head = orjson.dumps(doc, option=_NUMPY_OPT)
    if not chunks:
        return head, None
    return head + b"".join(chunks), len(head)


# ---------------------------------------------------------------------------- gRPC
def decode_grpc(req: Any) -> InferRequest:
    """Decode a ``ModelInferRequest`` (raw_input_contents or typed contents).

    Each protobuf field is read once: on upb a repeated field's access is a new wrapper each
    time (``benchmarks/serving/grpc_inprocess.py`` measures the servicer)."""
    tensors = req.inputs
    if not tensors:
        raise InvalidInput("request needs at least one input tensor")
    raw = req.raw_input_contents
    n_raw = len(raw)
    if n_raw:
        for tensor in tensors:
            if tensor.HasField("contents"):
                raise InvalidInput(
                    "the request has both raw_input_contents and typed contents; send each "
                    "input's data one way only"
                )
        if n_raw != len(tensors):
            raise InvalidInput(
                f"raw_input_contents has {n_raw} entries but the request has {len(tensors)} "
                "inputs; send one entry per input, in order"
            )
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for i, tensor in enumerate(tensors):
        name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
        if n_raw:
            array = array_from_bytes(name, datatype, shape, raw[i])
        else:
            array = _array_from_contents(name, datatype, shape, tensor.contents)
        if name in inputs:
            raise InvalidInput(f"input '{name}' appears twice")
        inputs[name] = array
        datatypes[name] = datatype
    request = InferRequest(inputs, datatypes, raw_outputs=n_raw > 0)
    rid = req.id
    if rid:
        request.id = rid
    parameters = req.parameters
    if parameters:
        request.parameters = {k: _param_value(v) for k, v in parameters.items()}
    outputs = req.outputs
    if outputs:
        request.outputs = [o.name for o in outputs]
    return request


def _array_from_contents(name: str, datatype: str, shape: list[int], contents: Any) -> np.ndarray:
    field_name = GRPC_CONTENTS_FIELD.get(datatype)
    if field_name is None:
        if datatype in V2_TO_NUMPY:
            raise InvalidInput(f"input '{name}': {datatype} travels in raw_input_contents only")
        raise InvalidInput(
            f"input '{name}' has unknown datatype {datatype!r}; use one of {sorted(V2_TO_NUMPY)}"
        )
    present = contents.ListFields()  # the non-empty fields, one C call
    for field, _ in present:
        if field.name != field_name:
            raise InvalidInput(
                f"input '{name}' is declared {datatype} but its data is in '{field.name}'; "
                f"put it in '{field_name}'"
            )
    fixed = PACKED_FIXED.get(datatype)
    if fixed is not None:
        # Packed floats are the array's own little-endian bytes on the wire: read them from
        # the field's serialization (a third of numpy reading the repeated field element by
        # element). Key, length varint, payload; nothing else is in ``contents``.
        wire = contents.SerializeToString() if present else b""
        at, size, shift = 1, 0, 0
        while at < len(wire):
            byte = wire[at]
            at += 1
            size |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        array = np.frombuffer(wire, fixed, size // fixed.itemsize, at) if wire else \
            np.empty(0, fixed)
        return _reshape(name, array.astype(V2_TO_NUMPY[datatype], copy=False), shape)
    values = getattr(contents, field_name)
    if datatype == "BYTES":
        array = _decode_bytes_list(name, values)
    else:
        dtype = V2_TO_NUMPY[datatype]
        array = np.array(values, dtype=dtype)
        if dtype.kind in "iu" and dtype.itemsize < 4 and array.size:
            wide = np.array(values, dtype=np.int64)
            info = np.iinfo(dtype)
            if wide.min() < info.min or wide.max() > info.max:
                raise InvalidInput(f"input '{name}' has values outside the range of {datatype}")
    return _reshape(name, array, shape)


def _decode_bytes_list(name: str, values: Any) -> np.ndarray:
    items: list[str] = []
    for value in values:
        try:
            items.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidInput(f"input '{name}': a BYTES element is not UTF-8 text") from None
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _param_value(param: Any) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None

