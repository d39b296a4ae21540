"""What a rollout judges in the answers themselves, beside errors and latency.

Three checks, each with a bound in the rollout (defaults: ``scaling.rollout_*`` settings):

- **predictions**: the distribution of each output of the candidate against the baseline's on
  the same traffic (a canary's random share, or a shadow's copies), as PSI over the baseline's
  deciles (``monitoring/shift.py``); a constant or rescaled candidate moves it far past the
  bound, an identical one stays within the noise;
- **mismatch** (shadow): the share of copies whose outputs differ from the baseline's answer
  to the same request beyond ``answer_rtol``/``answer_atol``;
- **labels**: where labels arrive (``POST /v1/labels``), the mean squared error of each
  version's score (the Brier score of a classifier) over the labels joined since the rollout
  began; the candidate is rolled back when it is worse than the baseline's by more than
  ``max_loss_increase`` (relative) and by more than four standard errors.

Each waits for a minimum sample (``min_answers`` rows, ``min_labels`` labels per version), so
a handful of answers never decides.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from redline.monitoring.shift import prediction_shift

ROWS_PER_REQUEST = 16  # rows of one request kept in the sample (a big batch does not flood it)
SAMPLE_ROWS = 2048  # rows of recent answers kept per version and output
SHARED_ROWS = 256  # of them written for the other processes, once a second


class AnswerSample:
    """Recent answers of one version: each numeric output's values, by row, bounded."""

    def __init__(self, max_rows: int = SAMPLE_ROWS) -> None:
        self.max_rows = max_rows
        self._parts: dict[str, deque[np.ndarray]] = {}  # output -> (rows, values per row)
        self._rows: dict[str, int] = {}

    def add(self, outputs: dict[str, Any]) -> None:
        for name, value in outputs.items():
            a = np.asarray(value)
            if a.dtype.kind not in "fiub" or a.ndim == 0 or not a.shape[0]:
                continue
            rows = a[:ROWS_PER_REQUEST].reshape(min(a.shape[0], ROWS_PER_REQUEST), -1)
            parts = self._parts.setdefault(name, deque())
            parts.append(rows.astype(np.float64))
            total = self._rows.get(name, 0) + rows.shape[0]
            while total - parts[0].shape[0] >= self.max_rows:
                total -= parts.popleft().shape[0]
            self._rows[name] = total

    def outputs(self) -> list[str]:
        return list(self._parts)

    def values(self, name: str, max_rows: int | None = None) -> tuple[np.ndarray, int]:
        """The output's values (flat) and how many rows they come from (the newest rows)."""
        parts = list(self._parts.get(name, ()))
        if max_rows is not None:
            kept, rows = [], 0
            for part in reversed(parts):
                if rows >= max_rows:
                    break
                kept.append(part)
                rows += part.shape[0]
            parts = kept[::-1]
        if not parts:
            return np.zeros(0), 0
        return (np.concatenate([p.ravel() for p in parts]), sum(p.shape[0] for p in parts))

    def as_dict(self) -> dict[str, Any]:
        """The newest rows for the stats file (float32 precision: a shift is not in the 8th
        digit)."""
        out = {}
        for name in self._parts:
            values, rows = self.values(name, SHARED_ROWS)
            out[name] = {"rows": rows, "values": values.astype(np.float32).tolist()}
        return out


class MergedAnswers:
    """One version's answer samples over every process: values and row counts per output."""

    def __init__(self) -> None:
        self.values: dict[str, list[np.ndarray]] = {}
        self.rows: dict[str, int] = {}

    def add(self, name: str, values: np.ndarray, rows: int) -> None:
        self.values.setdefault(name, []).append(values)
        self.rows[name] = self.rows.get(name, 0) + rows

    def add_sample(self, sample: AnswerSample) -> None:
        for name in sample.outputs():
            self.add(name, *sample.values(name))

    def add_doc(self, doc: dict[str, Any]) -> None:
        for name, part in doc.items():
            self.add(name, np.asarray(part.get("values", []), dtype=np.float64),
                     int(part.get("rows", 0)))

    def get(self, name: str) -> tuple[np.ndarray, int]:
        parts = self.values.get(name)
        return (np.concatenate(parts) if parts else np.zeros(0)), self.rows.get(name, 0)


def compare_answers(spec: Any, baseline: MergedAnswers, candidate: MergedAnswers
                    ) -> dict[str, Any]:
    """Per output the candidate's shift against the baseline (what status shows)."""
    out: dict[str, Any] = {}
    for name in sorted(set(baseline.rows) & set(candidate.rows)):
        b_values, b_rows = baseline.get(name)
        c_values, c_rows = candidate.get(name)
        shift = prediction_shift(b_values, c_values, b_rows, c_rows, spec.max_prediction_psi)
        out[name] = {"baseline_rows": b_rows, "candidate_rows": c_rows, **shift}
    return out


def judge_answers(spec: Any, baseline: MergedAnswers, candidate: MergedAnswers) -> str | None:
    """Why the candidate's answers are off (their distribution), or None (or too few yet)."""
    for name, shift in compare_answers(spec, baseline, candidate).items():
        if min(shift["baseline_rows"], shift["candidate_rows"]) < spec.min_answers:
            continue
        if shift["shifted"]:
            return (f"predictions of output '{name}' shifted from the baseline's: PSI "
                    f"{shift['psi']:.3g} > {shift['limit']:.3g} over {shift['candidate_rows']} "
                    f"candidate and {shift['baseline_rows']} baseline rows")
    return None


def same_answer(primary: dict[str, Any], other: dict[str, Any], rtol: float,
                atol: float) -> tuple[bool, float]:
    """Whether a shadow copy answered as the baseline did, and the largest difference."""
    same, largest = True, 0.0
    for name, value in (primary or {}).items():
        mine = other.get(name)
        if mine is None or np.shape(mine) != np.shape(value):
            same = False
            continue
        if np.issubdtype(np.asarray(value).dtype, np.number):
            a, b = np.asarray(mine, np.float64), np.asarray(value, np.float64)
            largest = max(largest, float(np.max(np.abs(a - b), initial=0.0)))
            same = same and bool(np.allclose(a, b, rtol=rtol, atol=atol))
        else:
            same = same and bool(np.array_equal(mine, value))
    return same, largest


def judge_mismatch(spec: Any, compared: int, mismatched: int) -> str | None:
    """Why the shadow's answers disagree too often with the baseline's, or None."""
    if compared < spec.min_answers or not compared:
        return None
    rate = mismatched / compared
    if rate > spec.max_mismatch_rate:
        return (f"{mismatched} of {compared} shadow answers ({rate:.1%}) differ from the "
                f"baseline's beyond rtol {spec.answer_rtol:g}/atol {spec.answer_atol:g} "
                f"(bound {spec.max_mismatch_rate:.1%})")
    return None


def label_loss(pairs: np.ndarray) -> dict[str, Any]:
    """Mean squared error of (score, label) pairs, with its standard error."""
    n = int(pairs.shape[0])
    if not n:
        return {"labelled": 0, "loss": None, "se": None}
    loss = (pairs[:, 0] - pairs[:, 1]) ** 2
    return {"labelled": n, "loss": float(loss.mean()),
            "se": float(loss.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf}


def judge_labels(spec: Any, baseline: np.ndarray, candidate: np.ndarray) -> str | None:
    """Why the candidate's realised loss is worse than the baseline's, or None."""
    b, c = label_loss(baseline), label_loss(candidate)
    if min(b["labelled"], c["labelled"]) < spec.min_labels:
        return None
    worse = c["loss"] - b["loss"]
    noise = 4.0 * math.sqrt(b["se"] ** 2 + c["se"] ** 2)
    if worse > max(spec.max_loss_increase * b["loss"], noise, spec.answer_atol ** 2):
        return (f"realised loss (squared error against labels) {c['loss']:.4g} vs baseline "
                f"{b['loss']:.4g} over {c['labelled']} and {b['labelled']} labels")
    return None
