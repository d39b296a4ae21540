"""The parity check: the original framework and ONNX Runtime run the same sample and must agree.

A difference counts as ``|onnx - original| / max(1, |original|)``, so regressors with large
targets are judged relatively and probabilities absolutely; labels must match wherever the
probabilities leave no doubt. A refusal says where the two differ most and what to do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.errors import ConversionError
from redline.models.convert.frameworks import import_framework
from redline.models.convert.from_lightgbm import is_booster
from redline.models.convert.signature import ConvertedModel, plain


def check_parity(model: Any, converted: ConvertedModel, x: np.ndarray, tolerance: float) -> float:
    """Run both sides on ``x``; return the largest absolute difference, raise if too large."""
    expected = reference_outputs(model, converted, x)
    session = ort_session(converted.onnx_bytes)
    try:
        got = session.run(None, {converted.input_name: x})
    except Exception as exc:
        raise ConversionError(f"the converted ONNX model fails on the sample: {exc}") from exc
    actual = dict(zip([o.name for o in session.get_outputs()], got, strict=True))
    score_name = converted.output_names[-1]  # probabilities / variable / output
    max_abs_diff = compare_output(score_name, expected[score_name], actual[score_name], tolerance)
    if converted.task == "classification" and "label" in expected:
        check_labels(expected["label"], actual["label"], _rows(expected[score_name]), tolerance)
    return max_abs_diff


def compare_output(name: str, original: Any, onnx_out: Any, tolerance: float) -> float:
    """The largest absolute difference between one output of both sides, row by row; a
    ``ConversionError`` naming the row and column when one differs by more than ``tolerance``."""
    ref = _rows(original)
    try:
        out = np.asarray(onnx_out, dtype=np.float64).reshape(ref.shape[0], -1)
    except ValueError:
        out = np.asarray(onnx_out, dtype=np.float64)
    if ref.shape != out.shape:
        raise ConversionError(
            f"the converted model's '{name}' has shape {out.shape[1:]} per row but the "
            f"original gives {ref.shape[1:]}; the model cannot be converted faithfully."
        )
    abs_diff = np.abs(out - ref)
    abs_diff[np.isnan(out) & np.isnan(ref)] = 0.0
    abs_diff[np.isnan(abs_diff)] = np.inf  # NaN on one side only is a total disagreement
    if not abs_diff.size:
        return 0.0
    scaled = abs_diff / np.maximum(1.0, np.abs(np.nan_to_num(ref)))
    row, col = np.unravel_index(int(np.argmax(scaled)), scaled.shape)
    if scaled[row, col] > tolerance:
        raise ConversionError(
            f"conversion refused: the ONNX model's '{name}' differs from the original by "
            f"{abs_diff[row, col]:.3g} (relative {scaled[row, col]:.3g}) at sample row {row}, "
            f"column {col} (original {ref[row, col]:.9g}, ONNX {out[row, col]:.9g}); the "
            f"tolerance is {tolerance:g}. If the difference is float32 rounding, pass a larger "
            "tolerance (--tolerance); otherwise check the model and the sample.",
            max_abs_diff=float(abs_diff[row, col]),
            row=int(row),
            tolerance=tolerance,
        )
    return float(abs_diff.max())


def _rows(values: Any) -> np.ndarray:
    """``values`` as float64 rows, one per sample row (a scalar output is one row)."""
    ref = np.asarray(values, dtype=np.float64)
    return ref.reshape(ref.shape[0] if ref.ndim else 1, -1)


def check_labels(ref_labels: Any, onnx_labels: Any, proba: np.ndarray, tolerance: float) -> None:
    """Labels must match wherever the top two probabilities are further apart than ``tolerance``."""
    ref_l = np.asarray(ref_labels).ravel()
    out_l = np.asarray(onnx_labels).ravel()
    if proba.shape[1] >= 2:
        top2 = np.sort(proba, axis=1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
    else:
        margin = np.full(len(ref_l), np.inf)
    same = np.array([plain(a) == plain(b) for a, b in zip(ref_l, out_l, strict=True)])
    bad = np.flatnonzero(~same & (margin > tolerance))
    if bad.size:
        row = int(bad[0])
        raise ConversionError(
            f"conversion refused: the ONNX model predicts label {plain(out_l[row])!r} but the "
            f"original predicts {plain(ref_l[row])!r} at sample row {row} ({bad.size} rows "
            f"disagree) although their probabilities agree within the tolerance {tolerance:g}; "
            "check the model (its classes_) and the sample.",
            row=row,
            tolerance=tolerance,
        )


def reference_outputs(model: Any, converted: ConvertedModel, x: np.ndarray) -> dict[str, Any]:
    """What the original framework returns for ``x``, under the canonical output names."""
    try:
        if converted.framework == "pytorch":
            torch = import_framework("torch", "torch")
            with torch.no_grad():
                out = model(torch.from_numpy(x))
            if not isinstance(out, torch.Tensor):
                raise ConversionError(
                    f"the module returns {type(out).__name__}; redline converts modules whose "
                    "forward returns one tensor. Wrap it in a module that returns one."
                )
            return {"output": out.detach().cpu().numpy()}
        if is_booster(model):
            raw = np.asarray(model.predict(x))
            if converted.task == "classification":
                proba = np.column_stack([1.0 - raw, raw]) if raw.ndim == 1 else raw
                return {"label": np.argmax(proba, axis=1), "probabilities": proba}
            return {"variable": raw}
        if converted.task == "classification":
            return {"label": model.predict(x), "probabilities": model.predict_proba(x)}
        return {"variable": model.predict(x)}
    except ConversionError:
        raise
    except Exception as exc:
        raise ConversionError(
            f"the original {type(model).__name__} fails on the sample: "
            f"{str(exc).rstrip('. ')}. The sample must be "
            "rows the model accepts (same features, in training order)."
        ) from exc


def ort_session(data: bytes) -> Any:
    """An onnxruntime CPU session for ``data``, or a ``ConversionError`` if it will not load."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ConversionError(f"the ONNX model cannot be loaded by onnxruntime: {exc}") from exc
