"""The REST JSON fast path: the common request decoded straight to a checked numpy array.

Nearly every REST JSON request to a tabular model has one shape::

    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 30], "data": [...]}]}

(optionally with an ``"id"``). For a model with one float input of fixed trailing dimensions,
:class:`JsonFastPath` recognises exactly that shape with a msgspec struct decoder, checks it
against the model in a few comparisons, and answers with one ``orjson.dumps`` whose per-output
strings were built once per model version.

Why it is shaped so: measured against the bare ASGI floor (``benchmarks/serving/floors``: orjson,
``np.asarray``, ONNX Runtime, nothing else), one row of the 30-feature demo forest cost ~11 µs
more server CPU in redline, nearly all of it Python-level work spread over the general decoder
(every key, datatype, shape and nested-data check), ``InferRequest``, the model's input check and
the general encoder (datatype lookups, binary-output branches). This path replaces those with
one typed decode and the few checks that can fail for a well-formed request.

It never answers an error itself: anything it does not recognise (another key such as
``parameters`` or ``outputs``, a second input, nested or non-numeric data, a wrong name,
datatype or shape, a non-finite value where the model rejects them, binary data) returns
``None`` and the request takes the general path, which says precisely what is wrong. A refused
request is decoded twice; that costs only requests that fail or use the rarer features.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import msgspec
import numpy as np
import orjson

from redline.models.datatypes import V2_TO_NUMPY

_NUMPY_OPT = orjson.OPT_SERIALIZE_NUMPY
_FLOAT_TYPES = ("FP32", "FP64")
_SCAN_MAX = 4096  # values the finiteness scan handles here; larger requests take the general path


class _Tensor(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    datatype: str
    shape: list[int]
    data: list[float]  # flat only; ints are accepted as floats, as the general path does


class _Request(msgspec.Struct, forbid_unknown_fields=True):
    inputs: list[_Tensor]
    id: str | None = None


_DECODER = msgspec.json.Decoder(_Request)

# A value beyond FP32's range casts to inf and the scan below multiplies it by 0 on purpose;
# such a request is declined and the general path answers it, so numpy's warnings are noise.
warnings.filterwarnings("ignore", "invalid value encountered in dot", RuntimeWarning,
                        module=__name__)
warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning,
                        module=__name__)


class JsonFastPath:
    """Decode and encode for one model version; build with :meth:`for_model`."""

    __slots__ = ("input_name", "datatype", "dtype", "trailing", "width", "reject_nan",
                 "_zeros", "_head", "_outputs")

    def __init__(
        self, input_spec: Any, output_specs: list[Any], model_name: str, model_version: str,
        reject_nan: bool,
    ) -> None:
        self.input_name: str = input_spec.name
        self.datatype: str = input_spec.datatype
        self.dtype = V2_TO_NUMPY[self.datatype]
        self.trailing: list[int] = list(input_spec.shape[1:])
        self.width = math.prod(self.trailing)
        self.reject_nan = reject_nan
        self._zeros = np.zeros(_SCAN_MAX, self.dtype)
        # Per output: its name, the numpy dtype its declared datatype has, the fixed JSON keys.
        self._outputs = [(o.name, V2_TO_NUMPY.get(o.datatype), o.datatype) for o in output_specs]
        self._head = {"model_name": model_name, "model_version": model_version}

    @classmethod
    def for_model(
        cls, inputs: list[Any], outputs: list[Any], model_name: str, model_version: str,
        reject_nan: bool,
    ) -> JsonFastPath | None:
        """The fast path for a model with one batched float input of fixed trailing shape."""
        if len(inputs) != 1:
            return None
        spec = inputs[0]
        if spec.datatype not in _FLOAT_TYPES or not spec.shape or spec.shape[0] != -1:
            return None
        if any(d < 0 for d in spec.shape[1:]):
            return None
        # BYTES and FP16 outputs need the general encoder's conversions.
        if any(o.datatype in ("BYTES", "FP16") or o.datatype not in V2_TO_NUMPY for o in outputs):
            return None
        return cls(spec, outputs, model_name, model_version, reject_nan)

    def decode(self, body: bytes) -> tuple[dict[str, np.ndarray], int, str | None] | None:
        """``({input: array}, rows, id)`` for a request of the common shape, else ``None``."""
        try:
            request = _DECODER.decode(body)
        except msgspec.MsgspecError:
            return None
        if len(request.inputs) != 1:
            return None
        tensor = request.inputs[0]
        shape = tensor.shape
        if (tensor.name != self.input_name or tensor.datatype != self.datatype
                or shape[1:] != self.trailing or len(shape) != len(self.trailing) + 1):
            return None
        rows = shape[0]
        data = tensor.data
        if rows < 1 or rows * self.width != len(data):
            return None
        array = np.array(data, self.dtype).reshape(shape)
        # Decoded JSON holds no NaN, but a cast to FP32 can overflow to inf (refused by the
        # general path, whether or not the model allows missing values). x·0 is 0 for finite x
        # and NaN otherwise, so this dot is finite exactly when every value is.
        size = len(data)
        if size > _SCAN_MAX or not math.isfinite(array.reshape(-1).dot(self._zeros[:size])):
            return None
        return {self.input_name: array}, rows, request.id

    def encode(self, outputs: dict[str, np.ndarray], rid: str | None) -> bytes | None:
        """The JSON response (every output, as data), or ``None`` when an output is missing or
        not of its declared dtype (the general encoder then writes what the model returned)."""
        entries = []
        for name, dtype, datatype in self._outputs:
            array = outputs.get(name)
            if array is None or array.dtype != dtype:
                return None
            entries.append({"name": name, "datatype": datatype, "shape": array.shape,
                            "data": array.ravel()})
        doc: dict[str, Any] = dict(self._head)
        if rid is not None:
            doc["id"] = rid
        doc["outputs"] = entries
        return orjson.dumps(doc, option=_NUMPY_OPT)
