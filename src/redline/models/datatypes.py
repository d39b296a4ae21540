"""Datatype names of the Open Inference Protocol v2, and their numpy and ONNX equivalents.

Defined once here so the repository, the runtime, the wire codec and the load generator agree
on every name, and on the raw wire form of a tensor.
"""

from __future__ import annotations

import struct

import numpy as np

V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

NUMPY_TO_V2: dict[np.dtype, str] = {dt: name for name, dt in V2_TO_NUMPY.items()}

# ONNX TensorProto element type (int) -> V2 datatype.
ONNX_TO_V2: dict[int, str] = {
    9: "BOOL",
    3: "INT8",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    2: "UINT8",
    4: "UINT16",
    12: "UINT32",
    13: "UINT64",
    10: "FP16",
    1: "FP32",
    11: "FP64",
    8: "BYTES",
}

# onnxruntime reports types as strings such as "tensor(float)".
ORT_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64"})
INT_TYPES = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})


def v2_datatype(dtype: np.dtype) -> str:
    """The V2 datatype name of a numpy dtype (strings and objects map to BYTES)."""
    name = NUMPY_TO_V2.get(dtype)
    if name is not None:
        return name  # the common case: one dict lookup
    if dtype.kind in ("U", "S", "O"):
        return "BYTES"
    return NUMPY_TO_V2[np.dtype(dtype).newbyteorder("=")]


def bytes_elements_to_wire(array: np.ndarray) -> bytes:
    """The BYTES wire form (each element: 4-byte little-endian length, then its bytes)."""
    parts: list[bytes] = []
    for item in array.ravel():
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def array_to_wire(array: np.ndarray) -> bytes:
    """Raw little-endian bytes of a tensor: Triton's binary extension and gRPC raw contents.

    Neutral on purpose: the server's codec and the load generator (``bench``) both use it.
    """
    if array.dtype.kind in "OUS":
        return bytes_elements_to_wire(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes()
