"""Measure models side by side: latency (interleaved, so every model sees the same machine),
task metrics on validation data, and how far each model's outputs move from a reference.

Latency is measured round-robin: in every round each model runs once on the same batch, in an
order that rotates, so a noisy neighbour or a frequency change hits all models alike and the
ratios between them stay trustworthy even on a shared machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from redline.config import RuntimeSettings
from redline.errors import CorruptModel, InvalidInput
from redline.models import choose_providers, session_options

# metric name -> +1 when higher is better, -1 when lower is better
METRIC_DIRECTION = {"accuracy": 1, "roc_auc": 1, "log_loss": -1, "rmse": -1}
_ORT_NUMPY = {"tensor(float)": np.float32, "tensor(double)": np.float64,
              "tensor(float16)": np.float16, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


@dataclass
class Outputs:
    """What a model predicted for a set of rows: labels (classifiers) and float scores."""

    scores: np.ndarray  # [rows, columns] float64: probabilities, values or raw outputs
    labels: np.ndarray | None = None


class ModelRunner:
    """One ONNX model under given runtime settings; the unit that gets profiled."""

    def __init__(self, onnx_bytes: bytes, *, task: str, class_labels: list[Any] | None,
                 settings: RuntimeSettings | None = None, name: str = "model") -> None:
        self.name = name
        self.task = task
        self.settings = settings or RuntimeSettings()
        try:
            self.session = ort.InferenceSession(
                onnx_bytes, sess_options=session_options(self.settings),
                providers=choose_providers(self.settings.providers),
            )
        except Exception as exc:
            raise CorruptModel(
                f"ONNX Runtime cannot load candidate '{name}': {str(exc)[:300]}") from exc
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            raise InvalidInput(
                f"model '{name}' has {len(inputs)} inputs; optimize and gate work on models with "
                "one 2-D feature input"
            )
        self.input_name = inputs[0].name
        self.input_dtype = _ORT_NUMPY.get(inputs[0].type, np.float32)
        width = inputs[0].shape[1] if len(inputs[0].shape) == 2 else None
        self.n_features = width if isinstance(width, int) else None
        outs = self.session.get_outputs()
        names = [o.name for o in outs]
        float_outs = [o.name for o in outs if o.type in ("tensor(float)", "tensor(double)",
                                                          "tensor(float16)")]
        if not float_outs:
            raise InvalidInput(f"model '{name}' has no floating-point output to evaluate")
        self.score_name = "probabilities" if "probabilities" in names else float_outs[0]
        self.label_name = "label" if ("label" in names and task == "classification") else None
        self.class_labels = class_labels
        self._run = self.session.run

    def feed(self, x: np.ndarray) -> dict[str, np.ndarray]:
        return {self.input_name: np.ascontiguousarray(x, dtype=self.input_dtype)}

    def run_feed(self, feed: dict[str, np.ndarray]) -> list[Any]:
        """Every output, as a server would compute them: this is what latency measures."""
        return self._run(None, feed)

    def predict(self, x: np.ndarray, chunk: int = 2048) -> Outputs:
        wanted = [self.score_name] + ([self.label_name] if self.label_name else [])
        scores, labels = [], []
        for start in range(0, len(x), chunk):
            result = self._run(wanted, self.feed(x[start:start + chunk]))
            scores.append(np.asarray(result[0], dtype=np.float64).reshape(len(result[0]), -1))
            if self.label_name:
                labels.append(np.asarray(result[1]).reshape(-1))
        score = np.concatenate(scores)
        label = np.concatenate(labels) if labels else None
        if label is None and self.task == "classification":
            classes = self.class_labels or list(range(score.shape[1]))
            label = np.asarray(classes, dtype=object)[np.argmax(score, axis=1)]
        return Outputs(score, label)


# ------------------------------------------------------------------------------ metrics
def same_labels(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise label equality that treats 1, 1.0 and '1' alike (CSV labels read as floats)."""
    a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    try:
        return np.asarray(a.astype(np.float64) == b.astype(np.float64))
    except (TypeError, ValueError):
        return np.asarray(a.astype(str) == b.astype(str))


def task_metrics(task: str, out: Outputs, y: np.ndarray,
                 class_labels: list[Any] | None) -> dict[str, float]:
    """Accuracy, log loss and (binary) ROC AUC for classifiers; RMSE for regressors."""
    if task != "classification":
        target = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
        if target.shape[1] != out.scores.shape[1]:
            raise InvalidInput(
                f"the labels have {target.shape[1]} column(s) but the model predicts "
                f"{out.scores.shape[1]}; pass the regression targets as the label column"
            )
        return {"rmse": float(np.sqrt(np.mean((out.scores - target) ** 2)))}
    assert out.labels is not None
    metrics = {"accuracy": float(same_labels(out.labels, y).mean())}
    classes = class_labels or list(range(out.scores.shape[1]))
    if out.scores.shape[1] == len(classes):
        index = _class_index(y, classes)
        if index is not None:
            p = np.clip(out.scores[np.arange(len(y)), index], 1e-15, 1.0)
            metrics["log_loss"] = float(-np.log(p).mean())
            if len(classes) == 2 and 0 < index.sum() < len(index):
                metrics["roc_auc"] = roc_auc(index == 1, out.scores[:, 1])
    return metrics


def _class_index(y: np.ndarray, classes: list[Any]) -> np.ndarray | None:
    index = np.full(len(y), -1)
    for i, c in enumerate(classes):
        index[same_labels(y, np.full(len(y), c, dtype=object))] = i
    return index if (index >= 0).all() else None


def roc_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic, ties averaged."""
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    sorted_scores = score[order]
    i = 0
    while i < len(score):
        j = i
        while j + 1 < len(score) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def primary_metric(task: str, requested: str | None = None) -> str:
    metric = requested or ("accuracy" if task == "classification" else "rmse")
    allowed = ["accuracy", "roc_auc", "log_loss"] if task == "classification" else ["rmse"]
    if metric not in allowed:
        raise InvalidInput(
            f"metric '{metric}' does not apply to a {task} model; use one of {allowed}")
    return metric


def relative_loss(metric: str, baseline: float, candidate: float) -> float:
    """How much worse the candidate is, as a share of the baseline (negative = better)."""
    worse = (baseline - candidate) * METRIC_DIRECTION[metric]
    return float(worse / max(abs(baseline), 1e-12))


def compare_outputs(task: str, reference: Outputs, out: Outputs,
                    regression_tolerance: float = 1e-3) -> dict[str, float]:
    """Largest absolute output difference and the share of rows whose answer changes."""
    diff = np.abs(out.scores - reference.scores) if out.scores.shape == reference.scores.shape \
        else np.full(1, np.inf)
    if task == "classification" and out.labels is not None and reference.labels is not None:
        changed = ~same_labels(out.labels, reference.labels)
    else:
        scale = np.maximum(1.0, np.abs(reference.scores))
        changed = (diff / scale > regression_tolerance).any(axis=1) if diff.ndim == 2 else \
            np.ones(len(reference.scores), dtype=bool)
    return {"max_abs_diff": float(diff.max()) if diff.size else 0.0,
            "disagreement": float(np.mean(changed))}


# ------------------------------------------------------------------------------ latency
@dataclass
class Latency:
    """Per-call latency samples at one batch size, in microseconds."""

    batch_size: int
    samples_us: np.ndarray = field(repr=False)

    @property
    def p50_us(self) -> float:
        return float(np.percentile(self.samples_us, 50))

    @property
    def p99_us(self) -> float:
        return float(np.percentile(self.samples_us, 99))

    @property
    def per_row_us(self) -> float:
        return self.p50_us / self.batch_size

    def to_dict(self) -> dict[str, float]:
        return {"batch_size": self.batch_size, "p50_us": round(self.p50_us, 2),
                "p99_us": round(self.p99_us, 2), "per_row_us": round(self.per_row_us, 3),
                "samples": int(self.samples_us.size)}


def measure_latency(
    runners: dict[str, ModelRunner],
    x: np.ndarray,
    batch_sizes: list[int],
    *,
    rounds: int = 300,
    warmup: int = 20,
    max_seconds: float | None = None,
    on_round: Callable[[], None] | None = None,
) -> dict[str, dict[int, Latency]]:
    """Interleaved latency of every runner at every batch size, on real rows of ``x``.

    ``max_seconds`` bounds the wall time per batch size: rounds stop early (all runners keep the
    same number of samples) so a slow model cannot stall a CI job.
    """
    if len(x) == 0:
        raise InvalidInput("no rows to measure latency on")
    names = list(runners)
    result: dict[str, dict[int, Latency]] = {name: {} for name in names}
    clock = time.perf_counter_ns
    for size in batch_sizes:
        blocks = [np.take(x, np.arange(start, start + size) % len(x), axis=0)
                  for start in range(0, max(len(x), size) * 1, max(size, 1))][:16]
        feeds = {name: [runners[name].feed(b) for b in blocks] for name in names}
        for name in names:
            for i in range(warmup):
                runners[name].run_feed(feeds[name][i % len(blocks)])
        samples = {name: np.empty(rounds) for name in names}
        deadline = time.monotonic() + max_seconds if max_seconds else None
        done = 0
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                feed = feeds[name][r % len(blocks)]
                run = runners[name].run_feed
                t0 = clock()
                run(feed)
                samples[name][r] = (clock() - t0) / 1000.0
            done = r + 1
            if on_round is not None:
                on_round()
            if deadline is not None and done >= 20 and time.monotonic() > deadline:
                break
        for name in names:
            result[name][size] = Latency(size, samples[name][:done])
    return result
