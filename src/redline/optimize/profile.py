"""Measure models side by side: latency (interleaved, so every model sees the same machine),
task metrics on validation data, and how far each model's outputs move from a reference.

Latency is measured in interleaved passes: in every pass each model is loaded, warmed until its
timings settle, timed and released in turn, in an order drawn at random and mirrored in the next
pass, and every sample remembers its pass, so ratios between models can be paired pass by pass
(``speed.latency_ratio``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import onnxruntime as ort

from redline.config import RuntimeSettings
from redline.errors import CorruptModel, InvalidInput
from redline.models import choose_providers, session_options

if TYPE_CHECKING:
    from redline.optimize.uncertainty import MetricRows

# metric name -> +1 when higher is better, -1 when lower is better
METRIC_DIRECTION = {"accuracy": 1, "roc_auc": 1, "log_loss": -1, "brier": -1, "rmse": -1}
# Proper scoring rules: judge the probabilities themselves, not only their argmax.
PROPER_SCORES = ("log_loss", "brier")
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
    """Accuracy, log loss, Brier score and (binary) ROC AUC for classifiers; RMSE for
    regressors. Log loss and Brier appear only when the scores are probabilities."""
    names = ["rmse"] if task != "classification" else [
        "accuracy", "log_loss", "brier", "roc_auc"]
    metrics = {}
    for name in names:
        rows = metric_rows(task, name, out, y, class_labels)
        if rows is None:
            continue
        if rows.per_row is not None:
            metrics[name] = float(rows.finish(np.asarray([np.mean(rows.per_row)]))[0])
        else:
            assert rows.on_rows is not None
            metrics[name] = float(rows.on_rows(np.arange(len(y))))
    return metrics


def is_probabilistic(out: Outputs, n_classes: int) -> bool:
    """Scores that are a probability distribution over the classes (rows sum to one)."""
    s = out.scores
    return bool(s.ndim == 2 and s.shape[1] == n_classes and len(s) and
                np.all(s >= -1e-6) and np.allclose(s.sum(axis=1), 1.0, atol=1e-3))


def metric_rows(task: str, metric: str, out: Outputs, y: np.ndarray,
                class_labels: list[Any] | None) -> MetricRows | None:
    """``metric`` in a form the bootstrap can resample, or None when it does not apply."""
    from redline.optimize.uncertainty import MetricRows

    if task != "classification":
        if metric != "rmse":
            return None
        target = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
        if target.shape[1] != out.scores.shape[1]:
            raise InvalidInput(
                f"the labels have {target.shape[1]} column(s) but the model predicts "
                f"{out.scores.shape[1]}; pass the regression targets as the label column"
            )
        return MetricRows(per_row=np.mean((out.scores - target) ** 2, axis=1), finish=np.sqrt)
    assert out.labels is not None
    if metric == "accuracy":
        return MetricRows(per_row=same_labels(out.labels, y).astype(np.float64))
    classes = class_labels or list(range(out.scores.shape[1]))
    if out.scores.shape[1] != len(classes):
        return None
    index = _class_index(y, classes)
    if index is None:
        return None
    rows = np.arange(len(y))
    if metric == "log_loss" and is_probabilistic(out, len(classes)):
        return MetricRows(per_row=-np.log(np.clip(out.scores[rows, index], 1e-15, 1.0)))
    if metric == "brier" and is_probabilistic(out, len(classes)):
        onehot = np.zeros_like(out.scores)
        onehot[rows, index] = 1.0
        return MetricRows(per_row=((out.scores - onehot) ** 2).sum(axis=1))
    if metric == "roc_auc" and len(classes) == 2 and 0 < index.sum() < len(index):
        positive, score = index == 1, out.scores[:, 1]

        def auc(idx: np.ndarray) -> float:
            pos = positive[idx]
            return roc_auc(pos, score[idx]) if 0 < pos.sum() < len(pos) else float("nan")

        return MetricRows(on_rows=auc)
    return None


def _class_index(y: np.ndarray, classes: list[Any]) -> np.ndarray | None:
    index = np.full(len(y), -1)
    for i, c in enumerate(classes):
        index[same_labels(y, np.full(len(y), c, dtype=object))] = i
    return index if (index >= 0).all() else None


def roc_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic, ties averaged."""
    from scipy.stats import rankdata

    ranks = rankdata(score)
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def primary_metric(task: str, requested: str | None = None) -> str:
    metric = requested or ("accuracy" if task == "classification" else "rmse")
    allowed = ["accuracy", "roc_auc", "log_loss", "brier"] if task == "classification" \
        else ["rmse"]
    if metric not in allowed:
        raise InvalidInput(
            f"metric '{metric}' does not apply to a {task} model; use one of {allowed}")
    return metric


def relative_loss(metric: str, baseline: float, candidate: float) -> float:
    """How much worse the candidate is, as a share of the baseline (negative = better)."""
    worse = (baseline - candidate) * METRIC_DIRECTION[metric]
    return float(worse / max(abs(baseline), 1e-12))


def compare_outputs(task: str, reference: Outputs, out: Outputs) -> dict[str, float]:
    """Largest absolute output difference, and how far the answers moved: for classifiers the
    share of rows whose label changes; for regressors the relative error RMS(out - reference) /
    RMS(reference - its mean), the measure the gate holds regressors to."""
    if out.scores.shape != reference.scores.shape:
        return {"max_abs_diff": float("inf"), "disagreement": 1.0}
    diff = answer_difference(reference.scores, out.scores)
    if task == "classification" and out.labels is not None and reference.labels is not None:
        moved = float(np.mean(~same_labels(out.labels, reference.labels)))
    else:
        ref = reference.scores[np.isfinite(reference.scores).all(axis=1)]
        spread = float(np.sqrt(np.mean((ref - ref.mean(axis=0)) ** 2))) if ref.size else 0.0
        moved = float(np.sqrt(np.mean(diff ** 2))) / (spread or 1.0) if diff.size else 0.0
    return {"max_abs_diff": float(np.abs(diff).max()) if diff.size else 0.0,
            "disagreement": moved}


def answer_difference(reference: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``scores - reference``, where two answers that are the same non-number (both NaN, or
    the same infinity) differ by zero and a number against a non-number by infinity."""
    with np.errstate(invalid="ignore"):
        diff = np.asarray(scores, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    same = (np.isnan(scores) & np.isnan(reference)) | (np.isinf(scores) & (scores == reference))
    diff[same] = 0.0
    diff[~np.isfinite(diff)] = np.inf
    return diff


# ------------------------------------------------------------------------------ latency
# Warm-up ends when the median of the latest calls moves by at most this share...
SETTLE = 0.03
# ...but not before this long (a fade slower than the checks' windows looks flat in them)...
WARM_MIN_SECONDS = 0.02
# ...and never longer than this, per session and batch size.
WARM_SECONDS = 1.0


@dataclass
class Latency:
    """Per-call latency samples at one batch size, in microseconds."""

    batch_size: int
    samples_us: np.ndarray = field(repr=False)
    # the interleaved pass each sample was timed in: speed-ups are paired pass by pass
    passes: np.ndarray | None = field(default=None, repr=False)
    # warm-up calls before each timed block, and how many blocks began before timings settled
    warmup_calls: np.ndarray | None = field(default=None, repr=False)
    unsettled: int = 0

    def per_pass(self, q: float) -> np.ndarray:
        """The ``q``-th percentile of each pass's samples, in pass order."""
        if self.passes is None:
            return np.asarray([np.percentile(self.samples_us, q)])
        return np.asarray([np.percentile(self.samples_us[self.passes == p], q)
                           for p in np.unique(self.passes)])

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
        d = {"batch_size": self.batch_size, "p50_us": round(self.p50_us, 2),
             "p99_us": round(self.p99_us, 2), "per_row_us": round(self.per_row_us, 3),
             "samples": int(self.samples_us.size)}
        if self.warmup_calls is not None and self.warmup_calls.size:
            d["warmup_calls_median"] = int(np.median(self.warmup_calls))
            d["warmup_unsettled"] = self.unsettled
        return d


class Timed(Protocol):
    """What latency is measured on: a ``ModelRunner``, or anything that runs prepared feeds."""

    def feed(self, x: np.ndarray) -> Any: ...

    def run_feed(self, feed: Any) -> Any: ...


RunnerFactory = Callable[[], Timed]
Clock = Callable[[], int]  # nanoseconds


def warm_until_stable(model: Timed, feeds: list[Any], *, min_calls: int = 10,
                      settle: float = SETTLE, min_ns: float = WARM_MIN_SECONDS * 1e9,
                      max_ns: float = WARM_SECONDS * 1e9,
                      clock: Clock = time.perf_counter_ns) -> tuple[int, bool]:
    """Run ``model`` until its latency stops moving; return (calls made, whether it settled).

    Calls run in doubling chunks. Once ``min_ns`` has passed, after each chunk the median of
    the latest half of all the warm-up calls is compared with the median of the quarter before
    it, and the timings have settled when two checks in a row find them within ``settle`` of
    each other. The windows grow, so each check is steadier than the last and reaches further
    back: a slowly fading warm-up (a large tree ensemble fills the caches with its node tables
    a path at a time) looks flat over a few calls, but not over twice as many, so it is not
    taken for stable while it still fades.
    """
    times: list[int] = []
    start = clock()
    chunk, steady = max(min_calls, 8), 0
    while True:
        for _ in range(chunk):
            t0 = clock()
            model.run_feed(feeds[len(times) % len(feeds)])
            t1 = clock()
            times.append(t1 - t0)
            if t1 - start >= max_ns:
                break
        n, spent = len(times), clock() - start
        if spent >= min_ns:
            latest = float(np.median(times[n // 2:]))
            before = float(np.median(times[n // 4:n // 2])) if n >= 4 else 0.0
            steady = steady + 1 if before > 0 and abs(latest / before - 1) <= settle else 0
            if steady == 2:
                return n, True
        if spent >= max_ns:
            return n, False
        chunk = n


def measure_latency(
    models: Mapping[str, RunnerFactory | Timed],
    x: np.ndarray,
    batch_sizes: list[int],
    *,
    rounds: int = 300,
    passes: int = 5,
    warmup: int = 10,
    max_seconds: float | None = None,
    on_round: Callable[[str, int], None] | None = None,
    settle: float = SETTLE,
    warm_seconds: float = WARM_SECONDS,
    seed: int = 0,
    clock: Clock = time.perf_counter_ns,
) -> dict[str, dict[int, Latency]]:
    """Latency of every model at every batch size, one session alive at a time.

    In each of ``passes`` passes every model's session is created, warmed until its timings
    stop moving (``warm_until_stable``, at least ``warmup`` calls, at most ``warm_seconds``),
    timed for ``rounds / passes`` calls per batch size, and released before the next model's
    session exists. So no model is timed while another model's weights compete for the same
    caches (four sessions of a 64 MB forest evict each other and inflate every figure), and
    a small model that warms in a few calls is not timed against a large one still warming.

    The order of the models is drawn at random for every other pass and reversed for the pass
    after it: a drift of the machine's speed during a pair of passes falls on every model
    alike, and whatever running after a particular model does to the next one changes from
    pass to pass, so it shows in the spread of the paired ratios (``speed.latency_ratio``)
    instead of biasing them.

    ``models`` maps names to factories that build a fresh ``ModelRunner`` (the honest way);
    ready runners are accepted too and are then shared across passes (tests, tiny models).
    ``max_seconds`` bounds the wall time per batch size: passes stop early, after a whole pair
    (every model keeps the same number of samples), so a slow model cannot stall a CI job.
    ``on_round`` is called with a model's name and the pass after each of its timed blocks.
    """
    if len(x) == 0:
        raise InvalidInput("no rows to measure latency on")
    names = list(models)
    per_pass = max(1, -(-rounds // max(1, passes)))
    samples: dict[str, dict[int, list[float]]] = {n: {b: [] for b in batch_sizes} for n in names}
    pass_of: dict[str, dict[int, list[int]]] = {n: {b: [] for b in batch_sizes} for n in names}
    warmed: dict[str, dict[int, list[int]]] = {n: {b: [] for b in batch_sizes} for n in names}
    unsettled = {n: dict.fromkeys(batch_sizes, 0) for n in names}
    blocks = {size: [np.take(x, np.arange(start, start + size) % len(x), axis=0)
                     for start in range(0, max(len(x), size), max(size, 1))][:16]
              for size in batch_sizes}
    budget_ns = max_seconds * len(batch_sizes) * 1e9 if max_seconds else None
    rng = np.random.default_rng(seed)
    order = names
    started = clock()
    for p in range(max(1, passes)):
        order = [names[i] for i in rng.permutation(len(names))] if p % 2 == 0 else order[::-1]
        for name in order:
            source = models[name]
            runner: Timed = source() if callable(source) else source
            for size in batch_sizes:
                feeds = [runner.feed(b) for b in blocks[size]]
                calls, settled = warm_until_stable(runner, feeds, min_calls=warmup,
                                                   settle=settle, max_ns=warm_seconds * 1e9,
                                                   min_ns=min(WARM_MIN_SECONDS, warm_seconds)
                                                   * 1e9, clock=clock)
                warmed[name][size].append(calls)
                unsettled[name][size] += not settled
                out = samples[name][size]
                for r in range(per_pass):
                    feed = feeds[(p * per_pass + r) % len(feeds)]
                    t0 = clock()
                    runner.run_feed(feed)
                    out.append((clock() - t0) / 1000.0)
                pass_of[name][size].extend([p] * per_pass)
            del runner  # released before the next model's session is created
            if on_round is not None:
                on_round(name, p)
        if budget_ns is not None and p % 2 == 1 and clock() - started > budget_ns:
            break
    return {name: {size: Latency(size, np.asarray(samples[name][size][:rounds]),
                                 np.asarray(pass_of[name][size][:rounds]),
                                 np.asarray(warmed[name][size]), unsettled[name][size])
                   for size in batch_sizes} for name in names}
