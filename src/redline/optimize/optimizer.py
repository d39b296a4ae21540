"""``redline optimize``: make candidates, measure them all in one run, pick and register one.

The validation rows are split once: the tuning part is what techniques may learn from
(calibration, fine-tuning, distillation), the evaluation part is what every reported number and
the choice come from. The original is measured in the same interleaved run as the candidates, so
speed-ups are ratios taken under identical conditions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from redline.config import RuntimeSettings
from redline.errors import InvalidInput, RedlineError
from redline.optimize.candidates import Candidate, Skipped, TuneContext
from redline.optimize.distill import distill_candidates
from redline.optimize.graph import graph_candidates
from redline.optimize.profile import (
    Latency,
    ModelRunner,
    compare_outputs,
    measure_latency,
    primary_metric,
    relative_loss,
    task_metrics,
)
from redline.optimize.prune import magnitude_candidates, parameter_count, structured_candidates
from redline.optimize.quantize import fp16_candidates, quantize_candidates
from redline.optimize.trees import tree_candidates

Technique = Callable[[bytes, TuneContext], Iterator[Candidate | Skipped]]
TECHNIQUES: dict[str, Technique] = {
    "graph": graph_candidates,
    "quantize": quantize_candidates,
    "fp16": fp16_candidates,
    "prune": structured_candidates,
    "magnitude": magnitude_candidates,
    "trees": tree_candidates,
    "distill": distill_candidates,
}


class Progress(Protocol):
    def stage(self, label: str, total: int | None = None) -> None: ...
    def advance(self, n: int = 1) -> None: ...


class _Silent:
    def stage(self, label: str, total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


@dataclass
class OptimizeOptions:
    techniques: list[str] = field(default_factory=lambda: list(TECHNIQUES))
    tolerance: float = 0.01  # largest relative loss in the metric
    metric: str | None = None  # default: accuracy (classification) / rmse (regression)
    batch_size: int = 32  # the server's typical batch
    rounds: int = 300
    max_seconds: float | None = 30.0  # per batch size, all candidates together
    tune_share: float = 0.5
    seed: int = 0
    fast: bool = False
    rank_by: str = "p50"  # p50 | p99, at the typical batch size
    min_speedup: float = 1.05  # below this the original stays: not worth a new version

    def __post_init__(self) -> None:
        unknown = sorted(set(self.techniques) - set(TECHNIQUES))
        if unknown:
            raise InvalidInput(f"unknown technique(s) {unknown}; choose from {sorted(TECHNIQUES)}")
        if not 0.0 < self.tune_share < 1.0:
            raise InvalidInput("the tuning share must be between 0 and 1")
        if self.batch_size < 1 or self.rounds < 1:
            raise InvalidInput("batch size and rounds must be at least 1")
        if self.rank_by not in ("p50", "p99"):
            raise InvalidInput("rank-by must be p50 or p99")


@dataclass
class CandidateResult:
    name: str
    technique: str
    note: str
    recipe: dict[str, Any]
    settings: dict[str, Any]
    size_bytes: int
    n_parameters: int | None
    latency: dict[int, Latency]
    metrics: dict[str, float]
    metric_loss: float
    max_abs_diff: float
    disagreement: float
    within_tolerance: bool
    speedup: dict[int, float] = field(default_factory=dict)
    candidate: Candidate | None = field(default=None, repr=False)

    def profile(self) -> dict[str, Any]:
        return {
            "latency": {str(b): lat.to_dict() for b, lat in self.latency.items()},
            "speedup": {str(b): round(s, 3) for b, s in self.speedup.items()},
            "size_bytes": self.size_bytes,
            "parameters": self.n_parameters,
            "metrics": {k: round(v, 6) for k, v in self.metrics.items()},
            "metric_loss": round(self.metric_loss, 6),
            "max_abs_diff": self.max_abs_diff,
            "disagreement": round(self.disagreement, 6),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "technique": self.technique, "note": self.note,
                "recipe": self.recipe, "settings": self.settings,
                "within_tolerance": self.within_tolerance, **self.profile()}


@dataclass
class OptimizeReport:
    model: str
    version: int | None
    task: str
    metric: str
    tolerance: float
    batch_sizes: list[int]
    tune_rows: int
    eval_rows: int
    results: list[CandidateResult]
    skipped: list[Skipped]
    chosen: str | None = None
    reason: str = ""
    registered: dict[str, Any] | None = None

    def result(self, name: str) -> CandidateResult:
        return next(r for r in self.results if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "version": self.version, "task": self.task,
            "metric": self.metric, "tolerance": self.tolerance, "batch_sizes": self.batch_sizes,
            "tune_rows": self.tune_rows, "eval_rows": self.eval_rows,
            "candidates": [r.to_dict() for r in self.results],
            "skipped": [{"name": s.name, "technique": s.technique, "reason": s.reason}
                        for s in self.skipped],
            "chosen": self.chosen, "reason": self.reason, "registered": self.registered,
        }


def split(x: np.ndarray, y: np.ndarray, tune_share: float,
          seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Shuffle once and cut into (tune, eval); both parts keep at least one row."""
    if len(x) < 4:
        raise InvalidInput(f"need at least 4 validation rows to tune and evaluate, got {len(x)}")
    order = np.random.default_rng(seed).permutation(len(x))
    cut = min(max(1, int(round(len(x) * tune_share))), len(x) - 1)
    tune, evaluate = order[:cut], order[cut:]
    return x[tune], y[tune], x[evaluate], y[evaluate]


def optimize(
    model: bytes,
    x: np.ndarray,
    y: np.ndarray,
    *,
    task: str,
    class_labels: list[Any] | None,
    options: OptimizeOptions | None = None,
    base_settings: RuntimeSettings | None = None,
    name: str = "model",
    version: int | None = None,
    tune: tuple[np.ndarray, np.ndarray] | None = None,
    progress: Progress | None = None,
) -> OptimizeReport:
    """Build every applicable candidate, measure all of them with the original, choose one."""
    opts = options or OptimizeOptions()
    base = base_settings or RuntimeSettings()
    bar: Progress = progress or _Silent()
    metric = primary_metric(task, opts.metric)
    if y is None:
        raise InvalidInput("optimize needs labels to measure accuracy: pass --data with a label "
                           "column (or an .npz holding y)")
    if tune is not None:
        x_tune, y_tune, x_eval, y_eval = tune[0], tune[1], x, y
    else:
        x_tune, y_tune, x_eval, y_eval = split(x, y, opts.tune_share, opts.seed)
    original = ModelRunner(model, task=task, class_labels=class_labels, settings=base,
                           name="original")
    if original.n_features is not None and x.shape[1] != original.n_features:
        raise InvalidInput(f"the data has {x.shape[1]} features per row but model '{name}' "
                           f"expects {original.n_features}")
    ctx = TuneContext(x_tune, y_tune, task, class_labels, original, base, metric,
                      opts.tolerance, seed=opts.seed, fast=opts.fast)
    candidates: list[Candidate] = [Candidate("original", "original", model, note="as registered",
                                             n_parameters=_params(model))]
    skipped: list[Skipped] = []
    bar.stage("building candidates", len(opts.techniques))
    for technique in opts.techniques:
        bar.stage(f"building: {technique}")
        try:
            for item in TECHNIQUES[technique](model, ctx):
                if isinstance(item, Skipped):
                    skipped.append(item)
                else:
                    if item.n_parameters is None:
                        item.n_parameters = _params(item.onnx_bytes)
                    candidates.append(item)
        except RedlineError as exc:
            skipped.append(Skipped(technique, technique, exc.message))
        except Exception as exc:  # one broken technique must not sink the whole run
            skipped.append(Skipped(technique, technique, f"{type(exc).__name__}: {exc}"))
        bar.advance()

    runners: dict[str, ModelRunner] = {}
    for cand in candidates:
        try:
            runners[cand.name] = ModelRunner(
                cand.onnx_bytes, task=task, class_labels=class_labels,
                settings=cand.runtime_settings(base), name=cand.name)
        except RedlineError as exc:
            skipped.append(Skipped(cand.name, cand.technique, exc.message))
    kept = [c for c in candidates if c.name in runners]

    bar.stage("evaluating accuracy", len(kept))
    reference = runners["original"].predict(x_eval)
    base_metrics = task_metrics(task, reference, y_eval, class_labels)
    evaluated = {}
    for cand in kept:
        out = reference if cand.name == "original" else runners[cand.name].predict(x_eval)
        evaluated[cand.name] = (task_metrics(task, out, y_eval, class_labels),
                                compare_outputs(task, reference, out))
        bar.advance()

    batch_sizes = sorted({1, opts.batch_size})
    bar.stage("measuring latency (interleaved)", opts.rounds * len(batch_sizes))
    latency = measure_latency(runners, x_eval, batch_sizes, rounds=opts.rounds,
                              max_seconds=opts.max_seconds, on_round=bar.advance)

    results = []
    for cand in kept:
        metrics, diff = evaluated[cand.name]
        loss = relative_loss(metric, base_metrics[metric], metrics.get(metric, np.nan)) \
            if metric in metrics else float("inf")
        results.append(CandidateResult(
            name=cand.name, technique=cand.technique, note=cand.note, recipe=cand.recipe,
            settings=cand.settings, size_bytes=len(cand.onnx_bytes),
            n_parameters=cand.n_parameters, latency=latency[cand.name], metrics=metrics,
            metric_loss=loss, max_abs_diff=diff["max_abs_diff"],
            disagreement=diff["disagreement"], within_tolerance=bool(loss <= opts.tolerance),
            speedup={b: latency["original"][b].p50_us / latency[cand.name][b].p50_us
                     for b in batch_sizes},
            candidate=cand,
        ))
    report = OptimizeReport(name, version, task, metric, opts.tolerance, batch_sizes,
                            len(x_tune), len(x_eval), results, skipped)
    choose(report, opts)
    return report


def choose(report: OptimizeReport, opts: OptimizeOptions) -> CandidateResult | None:
    """The fastest candidate within tolerance at the typical batch size, if it beats the original
    by at least ``min_speedup``; sets ``report.chosen`` and ``report.reason``."""
    batch = max(report.batch_sizes)

    def cost(r: CandidateResult) -> tuple[float, int]:
        lat = r.latency[batch]
        return (lat.p50_us if opts.rank_by == "p50" else lat.p99_us, r.size_bytes)

    original = report.result("original")
    eligible = [r for r in report.results if r.name != "original" and r.within_tolerance]
    if not eligible:
        report.reason = (f"no candidate stays within {report.tolerance:.2%} relative "
                         f"{report.metric} loss; the original stays")
        return None
    best = min(eligible, key=cost)
    gain = cost(original)[0] / cost(best)[0]
    if gain < opts.min_speedup:
        report.reason = (f"the fastest candidate within tolerance ({best.name}) is only "
                         f"{gain:.2f}x faster at batch {batch} (needs {opts.min_speedup:.2f}x); "
                         "the original stays")
        return None
    report.chosen = best.name
    report.reason = (f"{best.name}: {gain:.2f}x faster ({opts.rank_by}) at batch {batch}, "
                     f"{report.metric} change {-best.metric_loss:+.2%} relative")
    return best


def _params(data: bytes) -> int:
    import onnx

    return parameter_count(onnx.load_from_string(data))
