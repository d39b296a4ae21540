"""Non-finite values in, non-finite values out: the checks that keep NaN away from training and
out of the repository.

A few NaN or inf cells fed to a fine-tune turn every weight into NaN, and a model whose outputs
are NaN still scores "accuracy" (argmax of NaN is class 0). So data are checked against the
model's missing-value policy before anything runs, techniques learn only from finite rows, and
a candidate with a non-finite weight or output is rejected before it can be measured as valid.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from redline.errors import InvalidInput

_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


def describe_nonfinite(x: np.ndarray, columns: list[str] | None = None, limit: int = 5) -> str:
    """"column 'f3': 2 NaN, 1 +inf; column 'f7': 4 -inf" — NaN and infinities named apart."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    names = columns or [f"column {i}" for i in range(x.shape[1])]
    parts = []
    for i in np.flatnonzero(~np.isfinite(x).all(axis=0)):
        col = x[:, i]
        kinds = [(int(np.isnan(col).sum()), "NaN"), (int(np.isposinf(col).sum()), "+inf"),
                 (int(np.isneginf(col).sum()), "-inf")]
        label = f"'{names[i]}'" if columns else names[i]
        parts.append(f"{label}: " + ", ".join(f"{n} {k}" for n, k in kinds if n))
    more = f"; and {len(parts) - limit} more column(s)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def check_data(x: np.ndarray, y: np.ndarray | None, *, policy: str, what: str,
               model: str, columns: list[str] | None = None) -> None:
    """Refuse non-finite features when the model rejects missing values, and non-finite labels
    always (a NaN label has no right answer to score against)."""
    x = np.asarray(x)
    if x.dtype.kind == "f" and policy != "allow" and not np.isfinite(x).all():
        rows = int((~np.isfinite(x).reshape(len(x), -1)).any(axis=1).sum())
        raise InvalidInput(
            f"{what} has non-finite values in {rows} of {len(x)} row(s) — "
            f"{describe_nonfinite(x, columns)} — but model '{model}' rejects missing values "
            "(missing_values: reject), as the server would; impute or drop those rows")
    if y is not None:
        labels = np.asarray(y)
        if labels.dtype.kind == "f" and not np.isfinite(labels).all():
            bad = int((~np.isfinite(labels.reshape(len(labels), -1))).any(axis=1).sum())
            raise InvalidInput(f"{what} has {bad} label(s) that are NaN or infinite; drop those "
                               "rows")


def finite_rows(x: np.ndarray) -> np.ndarray:
    """Boolean mask of rows with every feature finite (the rows techniques may learn from)."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        return np.ones(len(x), dtype=bool)
    return np.asarray(np.isfinite(x.reshape(len(x), -1)).all(axis=1))


def nonfinite_weights(data: bytes) -> tuple[int, int]:
    """(non-finite, total) float values among the model's initializers and tree attributes."""
    model = onnx.load_from_string(data)
    bad = total = 0
    for init in model.graph.initializer:
        if init.data_type in _FLOAT_TYPES:
            values = numpy_helper.to_array(init).astype(np.float64)
            bad += int((~np.isfinite(values)).sum())
            total += values.size
    for node in model.graph.node:
        for attr in node.attribute:
            if not attr.name.removesuffix("_as_tensor").endswith(("weights", "base_values")):
                continue  # leaf values; split thresholds may legitimately be infinite
            if attr.type == onnx.AttributeProto.FLOATS and attr.floats:
                values = np.asarray(attr.floats, dtype=np.float64)
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in _FLOAT_TYPES:
                values = numpy_helper.to_array(attr.t).astype(np.float64)
            else:
                continue
            bad += int((~np.isfinite(values)).sum())
            total += values.size
    return bad, total


def nonfinite_outputs(reference: np.ndarray, scores: np.ndarray) -> int:
    """Rows where the candidate answers NaN/inf although the original answered a number."""
    ref_ok = np.isfinite(reference.reshape(len(reference), -1)).all(axis=1)
    out_ok = np.isfinite(scores.reshape(len(scores), -1)).all(axis=1)
    return int((ref_ok & ~out_ok).sum())


def rejection(data: bytes, reference: np.ndarray | None = None,
              scores: np.ndarray | None = None, *, allowed_weights: int = 0) -> str | None:
    """Why a candidate must never be valid, or None when its weights and outputs are finite.

    ``allowed_weights``: non-finite weights the original itself has (a model that uses -inf as
    a mask keeps them); anything beyond is the technique's doing.
    """
    bad, total = nonfinite_weights(data)
    if bad > allowed_weights:
        return f"{bad} of {total} weights are NaN or infinite"
    if reference is not None and scores is not None:
        rows = nonfinite_outputs(reference, scores)
        if rows:
            return (f"answers NaN or infinity on {rows} of {len(scores)} evaluation rows where "
                    "the original answers a number")
    return None
