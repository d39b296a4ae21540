"""A Python model's answer held to its declared signature: names, dtypes, shapes, no NaN.

ONNX Runtime guarantees what a graph returns; a ``predict`` can return anything, and a float64
column or a NaN would otherwise reach clients as a wrong answer rather than an error. The check
runs on every batch, so it is a handful of comparisons per output and one pass over float data.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from redline.models.datatypes import V2_TO_NUMPY
from redline.models.metadata import TensorSpec

# x·0 is NaN exactly for NaN and ±inf: the dot product's finiteness is the array's (handle.py).
warnings.filterwarnings("ignore", "invalid value encountered in dot", RuntimeWarning,
                        module=__name__)


class BrokenSignature(Exception):
    """What ``predict`` returned does not match the declared outputs (the message says how;
    ``key`` names the kind of breach, the same for every batch that breaks it alike)."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class OutputCheck:
    """Checks one batch's outputs against the declared output specs."""

    def __init__(self, outputs: list[TensorSpec]) -> None:
        self.specs = [(s.name, s.datatype, V2_TO_NUMPY[s.datatype], tuple(s.shape[1:]))
                      for s in outputs]
        self.names = [s.name for s in outputs]
        self._zeros: dict[np.dtype, np.ndarray] = {}
        # The common answer, checked with as few operations as possible: a dict of exactly the
        # declared arrays (name, dtype, rank, fixed sizes, finite floats). BYTES outputs and
        # anything off take the full check below, which converts lists or says what is wrong.
        self._fast = None if any(s.datatype == "BYTES" for s in outputs) else [
            (s.name, V2_TO_NUMPY[s.datatype], len(s.shape),
             tuple((axis, d) for axis, d in enumerate(s.shape) if axis and d != -1),
             s.datatype in ("FP16", "FP32", "FP64")) for s in outputs]

    def __call__(self, outputs: Any, rows: int) -> dict[str, np.ndarray]:
        """The outputs, as arrays of the declared dtypes, or ``BrokenSignature``."""
        fast = self._fast
        if fast is not None and type(outputs) is dict and len(outputs) == len(fast):
            for name, dtype, ndim, fixed, floating in fast:
                value = outputs.get(name)
                if (type(value) is not np.ndarray or value.dtype != dtype
                        or value.ndim != ndim or value.shape[0] != rows):
                    break
                if fixed and any(value.shape[axis] != d for axis, d in fixed):
                    break
                if floating and value.size and not self._finite(value):
                    break
            else:
                return outputs
        return self._full(outputs, rows)

    def _finite(self, value: np.ndarray) -> bool:
        flat = value.ravel()
        zeros = self._zeros.get(value.dtype)
        if zeros is None or zeros.size < flat.size:
            zeros = self._zeros[value.dtype] = np.zeros(max(flat.size, 4096), value.dtype)
        return math.isfinite(flat.dot(zeros[: flat.size]))

    def _full(self, outputs: Any, rows: int) -> dict[str, np.ndarray]:
        if not isinstance(outputs, dict):
            raise BrokenSignature(f"predict returned {type(outputs).__name__}, not a dict of "
                                  f"output name -> array ({', '.join(self.names)})", "not-a-dict")
        if len(outputs) != len(self.specs) or any(n not in outputs for n in self.names):
            missing = [n for n in self.names if n not in outputs]
            extra = sorted(str(n) for n in outputs if n not in self.names)
            said = "; ".join(filter(None, [
                f"no {', '.join(repr(n) for n in missing)}" if missing else "",
                f"undeclared {', '.join(repr(n) for n in extra)}" if extra else ""]))
            raise BrokenSignature(f"predict returned outputs {sorted(map(str, outputs))} but the "
                                  f"signature declares {self.names} ({said})", "names")
        checked: dict[str, np.ndarray] = {}
        for name, datatype, dtype, trailing in self.specs:
            checked[name] = self._one(name, datatype, dtype, trailing, outputs[name], rows)
        return checked

    def _one(self, name: str, datatype: str, dtype: np.dtype, trailing: tuple[int, ...],
             value: Any, rows: int) -> np.ndarray:
        if type(value) is not np.ndarray:
            value = _as_array(name, datatype, dtype, value)
        if datatype == "BYTES":
            if value.dtype.kind not in "OUS":
                raise BrokenSignature(f"output '{name}' is {value.dtype}; the signature "
                                      "declares BYTES (strings)", f"{name}:dtype")
        elif value.dtype != dtype:
            raise BrokenSignature(
                f"output '{name}' is {value.dtype} but the signature declares {datatype} "
                f"({dtype}): return .astype(np.{dtype}), or declare {_v2(value.dtype)}",
                f"{name}:dtype")
        shape = value.shape
        if (len(shape) != len(trailing) + 1 or shape[0] != rows
                or any(w != -1 and g != w for g, w in zip(shape[1:], trailing, strict=True))):
            declared = [-1, *trailing]
            raise BrokenSignature(
                f"output '{name}' has shape {list(shape)} for {rows} input row(s); the signature "
                f"declares {declared} (rows first: one answer per input row, -1 any size)",
                f"{name}:shape")
        if dtype.kind == "f" and value.size:
            if not self._finite(value):
                bad = np.argwhere(~np.isfinite(value))[0]
                raise BrokenSignature(
                    f"output '{name}' holds NaN or infinity (first at row {int(bad[0])}"
                    + (f", index {[int(i) for i in bad]}" if len(bad) > 1 else "") + ")",
                    f"{name}:nan")
        return value


def _as_array(name: str, datatype: str, dtype: np.dtype, value: Any) -> np.ndarray:
    """A list (no dtype of its own) takes the declared one; anything with a dtype (a pandas
    Series, a numpy scalar) keeps its own and is checked like an array."""
    try:
        if hasattr(value, "dtype"):
            return np.asarray(value)
        return np.asarray(value, dtype=object if datatype == "BYTES" else dtype)
    except (TypeError, ValueError) as exc:
        raise BrokenSignature(f"output '{name}' is a {type(value).__name__} that is not an "
                              f"array of {datatype} ({exc})", f"{name}:type") from None


def _v2(dtype: np.dtype) -> str:
    from redline.models.datatypes import NUMPY_TO_V2

    return NUMPY_TO_V2.get(dtype, str(dtype))
