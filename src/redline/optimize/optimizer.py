"""``redline optimize``: make candidates, measure them all in one run, pick and register one.

The rows are split once into three sets that never mix: *fit* rows that techniques learn from
(calibration, fine-tuning, distillation), *choice* rows on which techniques steer and the
optimizer picks a candidate, and *evaluation* rows that give every reported figure and confirm
the pick. Every metric carries a 95% bootstrap interval, and "within tolerance" means the
interval's worse end is within tolerance. Candidates with a non-finite weight or answer are
rejected before anything is measured. Latency is timed with one session alive at a time over
interleaved passes, so a large model's siblings cannot evict it from cache and inflate figures,
and each session is warmed until its timings settle, so a small model is never timed against a
large one still warming; every speed-up carries an interval paired pass by pass, and only its
lower end can clear the threshold. A candidate keeps the original's contract or is not one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from redline.config import RuntimeSettings
from redline.errors import InvalidInput, RedlineError
from redline.optimize.candidates import Candidate, QuantizationOptions, Skipped, TuneContext
from redline.optimize.contract import (
    Contract,
    answers_rows,
    contract_breaks,
    io_contract,
    missing_value_probe,
)
from redline.optimize.distill import distill_candidates
from redline.optimize.graph import graph_candidates
from redline.optimize.profile import (
    METRIC_DIRECTION,
    PROPER_SCORES,
    SETTLE,
    WARM_SECONDS,
    Latency,
    ModelRunner,
    Outputs,
    compare_outputs,
    measure_latency,
    metric_rows,
    primary_metric,
)
from redline.optimize.prune import magnitude_candidates, parameter_count, structured_candidates
from redline.optimize.quantize import fp16_candidates, quantize_candidates
from redline.optimize.safety import (
    check_data,
    finite_rows,
    nonfinite_outputs,
    nonfinite_weights,
    rejection,
)
from redline.optimize.speed import Ratio, latency_ratio
from redline.optimize.trees import tree_candidates
from redline.optimize.uncertainty import (
    Interval,
    MetricRows,
    Resamples,
    interval,
    relative_loss_replicates,
)
from redline.optimize.user_metric import UserMetric

# Two candidates are reported as different speeds only when one is faster than the other by at
# least this much, by the lower end of their paired interval (or by --min-speedup, if larger).
DISTINCT_SPEED = 1.05

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
    """Where a run reports what it is doing: a stage (with its number of steps, if known) and
    each step as it finishes, with what it was (a candidate's name) for logs."""

    def stage(self, label: str, total: int | None = None) -> None: ...
    def advance(self, n: int = 1, detail: str = "") -> None: ...


class _Silent:
    def stage(self, label: str, total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1, detail: str = "") -> None:
        pass


@dataclass
class OptimizeOptions:
    techniques: list[str] = field(default_factory=lambda: list(TECHNIQUES))
    tolerance: float = 0.01  # largest relative loss in the metric (worse end of the interval)
    metric: str | None = None  # default: accuracy (classification) / rmse (regression)
    eval_fn: UserMetric | None = None  # a user's metric; replaces ``metric`` when given
    guard_metric: str | None = "auto"  # a second bound: auto = log loss for probabilities
    guard_tolerance: float = 0.10
    batch_size: int = 32  # the server's typical batch
    rounds: int = 300  # timed calls per candidate and batch size, over all passes
    passes: int = 5  # interleaved passes, each loading one session at a time
    max_seconds: float | None = 30.0  # per batch size, all candidates together
    fit_share: float = 1 / 3  # of --data, when no separate fit rows are given
    choice_share: float = 1 / 3
    bootstrap: int = 500
    seed: int = 0
    fast: bool = False
    rank_by: str = "p50"  # p50 | p99, at the typical batch size
    # the lower end of the speed-up's 95% interval must reach this, or the original stays
    min_speedup: float = 1.05
    quantization: QuantizationOptions = field(default_factory=QuantizationOptions)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.techniques) - set(TECHNIQUES))
        if unknown:
            raise InvalidInput(f"unknown technique(s) {unknown}; choose from {sorted(TECHNIQUES)}")
        if not (0.0 < self.fit_share and 0.0 < self.choice_share
                and self.fit_share + self.choice_share < 1.0):
            raise InvalidInput("the fit and choice shares must be positive and leave rows for "
                               "evaluation (fit + choice < 1)")
        if self.batch_size < 1 or self.rounds < 1 or self.passes < 1:
            raise InvalidInput("batch size, rounds and passes must be at least 1")
        if self.rank_by not in ("p50", "p99"):
            raise InvalidInput("rank-by must be p50 or p99")
        if self.quantization.calibration_rows < 1:
            raise InvalidInput("calibration rows must be at least 1")
        if self.bootstrap < 50:
            raise InvalidInput("use at least 50 bootstrap resamples")


@dataclass
class Judgement:
    """A candidate's relative loss against the original on one row set, with its interval."""

    loss: float
    interval: Interval
    guard_loss: float | None = None
    guard_interval: Interval | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"loss": round(self.loss, 6), "interval": self.interval.to_list()}
        if self.guard_loss is not None and self.guard_interval is not None:
            d["guard_loss"] = round(self.guard_loss, 6)
            d["guard_interval"] = self.guard_interval.to_list()
        return d


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
    metrics: dict[str, float]  # evaluation rows
    intervals: dict[str, Interval]  # evaluation rows, 95%
    evaluation: Judgement
    choice: Judgement
    max_abs_diff: float
    disagreement: float
    within_tolerance: bool  # on the choice rows, by the interval's worse end
    verdict: str = ""  # ok | too lossy | uncertain | guard
    speedup: dict[int, float] = field(default_factory=dict)  # p50, paired by pass
    speedup_interval: dict[int, Interval] = field(default_factory=dict)  # 95%
    tied_with: str | None = None  # as fast as this candidate, within the machine's noise
    candidate: Candidate | None = field(default=None, repr=False)

    @property
    def metric_loss(self) -> float:
        return self.evaluation.loss

    def profile(self) -> dict[str, Any]:
        return {
            "latency": {str(b): lat.to_dict() for b, lat in self.latency.items()},
            "speedup": {str(b): round(s, 3) for b, s in self.speedup.items()},
            # null high end: one pass, nothing to pair (JSON has no infinity)
            "speedup_interval": {str(b): [round(i.low, 3),
                                          round(i.high, 3) if np.isfinite(i.high) else None]
                                 for b, i in self.speedup_interval.items()},
            "size_bytes": self.size_bytes,
            "parameters": self.n_parameters,
            "metrics": {k: round(v, 6) for k, v in self.metrics.items()},
            "intervals": {k: v.to_list() for k, v in self.intervals.items()},
            "metric_loss": round(self.metric_loss, 6),
            "evaluation": self.evaluation.to_dict(),
            "choice": self.choice.to_dict(),
            "max_abs_diff": self.max_abs_diff,
            "disagreement": round(self.disagreement, 6),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "technique": self.technique, "note": self.note,
                "recipe": self.recipe, "settings": self.settings,
                "within_tolerance": self.within_tolerance, "verdict": self.verdict,
                "tied_with": self.tied_with,
                **self.profile()}


@dataclass
class OptimizeReport:
    model: str
    version: int | None
    task: str
    metric: str
    tolerance: float
    batch_sizes: list[int]
    rows: dict[str, int]  # fit, choice, evaluation
    results: list[CandidateResult]
    skipped: list[Skipped]
    rejected: list[Skipped] = field(default_factory=list)
    guard_metric: str | None = None
    guard_tolerance: float | None = None
    measurement: str = ""
    chosen: str | None = None
    reason: str = ""
    registered: dict[str, Any] | None = None
    contract: Contract | None = None  # the original's, which every candidate kept
    metric_direction: int = 1  # +1: higher is better

    @property
    def eval_rows(self) -> int:
        return self.rows["evaluation"]

    @property
    def tune_rows(self) -> int:
        return self.rows["fit"]

    def result(self, name: str) -> CandidateResult:
        return next(r for r in self.results if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "version": self.version, "task": self.task,
            "metric": self.metric, "tolerance": self.tolerance,
            "guard_metric": self.guard_metric, "guard_tolerance": self.guard_tolerance,
            "batch_sizes": self.batch_sizes, "rows": self.rows, "measurement": self.measurement,
            "confidence": 0.95,
            "contract": self.contract.to_dict() if self.contract else None,
            "candidates": [r.to_dict() for r in self.results],
            "skipped": [{"name": s.name, "technique": s.technique, "reason": s.reason}
                        for s in self.skipped],
            "rejected": [{"name": s.name, "technique": s.technique, "reason": s.reason}
                         for s in self.rejected],
            "chosen": self.chosen, "reason": self.reason, "registered": self.registered,
        }


def split(x: np.ndarray, y: np.ndarray, shares: list[float],
          seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Shuffle once and cut into len(shares) + 1 parts (the last takes the rest); every part
    keeps at least one row."""
    parts = len(shares) + 1
    if len(x) < 2 * parts:
        raise InvalidInput(f"need at least {2 * parts} labelled rows to fit, choose and "
                           f"evaluate, got {len(x)}")
    order = np.random.default_rng(seed).permutation(len(x))
    cuts, at = [], 0
    for i, share in enumerate(shares):
        at = min(max(at + 1, at + int(round(len(x) * share))), len(x) - (parts - 1 - i))
        cuts.append(at)
    return [(x[idx], y[idx]) for idx in np.split(order, cuts)]


class _Scorer:
    """Metrics of any model's outputs on one row set, with paired bootstrap resamples."""

    def __init__(self, task: str, y: np.ndarray, labels: list[Any] | None,
                 user: UserMetric | None, resamples: Resamples) -> None:
        self.task, self.y, self.labels, self.user, self.resamples = task, y, labels, user, \
            resamples

    def rows(self, metric: str, out: Outputs) -> MetricRows | None:
        if self.user is not None and metric == self.user.name:
            user, y = self.user, self.y
            return MetricRows(on_rows=lambda idx: user(
                y[idx], out.scores[idx], None if out.labels is None else out.labels[idx]))
        return metric_rows(self.task, metric, out, self.y, self.labels)

    def value(self, rows: MetricRows) -> float:
        if rows.per_row is not None:
            return float(rows.finish(np.asarray([np.mean(rows.per_row)]))[0])
        assert rows.on_rows is not None
        return float(rows.on_rows(np.arange(len(self.y))))


def _direction(metric: str, user: UserMetric | None) -> int:
    if user is not None and metric == user.name:
        return user.direction
    return METRIC_DIRECTION[metric]


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
    missing_values: str = "reject",
    feature_names: list[str] | None = None,
    progress: Progress | None = None,
) -> OptimizeReport:
    """Build every applicable candidate, measure all of them with the original, choose one.

    ``tune``: separate fit rows (``--train-data``); then ``x``/``y`` are split into choice and
    evaluation rows only. ``missing_values`` is the model's policy: with ``reject`` any NaN or
    inf is refused; with ``allow`` they are evaluated but never learned from.
    """
    opts = options or OptimizeOptions()
    base = base_settings or RuntimeSettings()
    bar: Progress = progress or _Silent()
    user = opts.eval_fn
    metric = user.name if user is not None else primary_metric(task, opts.metric)
    if y is None:
        raise InvalidInput("optimize needs labels to measure accuracy: pass --data with a label "
                           "column (or an .npz holding y)")
    check_data(x, y, policy=missing_values, what="the data", model=name, columns=feature_names)
    if tune is not None:
        check_data(tune[0], tune[1], policy=missing_values, what="the fit rows", model=name,
                   columns=feature_names)
        (x_choice, y_choice), (x_eval, y_eval) = split(x, y, [0.5], opts.seed)
        x_fit, y_fit = tune
    else:
        (x_fit, y_fit), (x_choice, y_choice), (x_eval, y_eval) = split(
            x, y, [opts.fit_share, opts.choice_share], opts.seed)
    original = ModelRunner(model, task=task, class_labels=class_labels, settings=base,
                           name="original")
    if original.n_features is not None and x.shape[1] != original.n_features:
        raise InvalidInput(f"the data has {x.shape[1]} features per row but model '{name}' "
                           f"expects {original.n_features}")
    finite = finite_rows(x_fit)  # techniques never learn from NaN/inf (they poison weights)
    if not finite.any():
        raise InvalidInput("every fit row has a NaN or infinite value; techniques need rows "
                           "without them")
    ctx = TuneContext(x_fit[finite], y_fit[finite], task, class_labels, original, base,
                      metric if user is None else "", opts.tolerance, seed=opts.seed,
                      fast=opts.fast, x_choice=x_choice, y_choice=y_choice,
                      quantization=opts.quantization, missing_values=missing_values)
    contract = io_contract(original, missing_values)
    probe = missing_value_probe(x_choice) if missing_values == "allow" else None
    answered = answers_rows(original, probe) if probe is not None else None
    candidates: list[Candidate] = [Candidate("original", "original", model, note="as registered",
                                             n_parameters=_params(model))]
    skipped: list[Skipped] = []
    bar.stage("building candidates", len(opts.techniques))
    for technique in opts.techniques:
        bar.stage(f"building: {technique}")
        built, before = len(candidates), len(skipped)
        try:
            for item in TECHNIQUES[technique](model, ctx):
                if isinstance(item, Skipped):
                    skipped.append(item)
                elif _runs_as_original(item, model, base):
                    skipped.append(Skipped(item.name, item.technique, "the same model as the "
                                           "original, run the same way: nothing to measure"))
                else:
                    if item.n_parameters is None:
                        item.n_parameters = _params(item.onnx_bytes)
                    candidates.append(item)
        except RedlineError as exc:
            skipped.append(Skipped(technique, technique, exc.message))
        except Exception as exc:  # one broken technique must not sink the whole run
            skipped.append(Skipped(technique, technique, f"{type(exc).__name__}: {exc}"))
        bar.advance(detail=f"{technique}: "
                    + (", ".join(c.name for c in candidates[built:]) or "no candidate")
                    + (f" ({len(skipped) - before} skipped)" if len(skipped) > before else ""))
    del original, ctx  # the teacher's session too: from here on, one session at a time

    allowed_bad, _ = nonfinite_weights(model)
    rejected: list[Skipped] = []
    outputs: dict[str, tuple[Outputs, Outputs]] = {}
    bar.stage("evaluating (one model at a time)", len(candidates))
    for cand in candidates:
        try:
            runner = ModelRunner(cand.onnx_bytes, task=task, class_labels=class_labels,
                                 settings=cand.runtime_settings(base), name=cand.name)
        except RedlineError as exc:
            skipped.append(Skipped(cand.name, cand.technique, exc.message))
            bar.advance(detail=f"{cand.name}: skipped, it does not load")
            continue
        pair = (runner.predict(x_choice), runner.predict(x_eval))
        broken = None if cand.name == "original" else contract_breaks(contract, runner, probe,
                                                                      answered)
        del runner
        why = f"breaks the original's contract: {broken}" if broken else (
            None if cand.name == "original" else
            _why_rejected(cand, allowed_bad, outputs["original"], pair))
        if why:
            rejected.append(Skipped(cand.name, cand.technique, f"rejected: {why}"))
            bar.advance(detail=f"{cand.name}: rejected")
            continue
        outputs[cand.name] = pair
        bar.advance(detail=cand.name)
    kept = [c for c in candidates if c.name in outputs]

    scorers = [_Scorer(task, yy, class_labels, user, Resamples(len(yy), opts.bootstrap, seed=k))
               for k, yy in enumerate((y_choice, y_eval))]
    guard = _guard_metric(opts, task, metric, outputs["original"][1], scorers[1])
    judged = {c.name: _judge(c.name, outputs, scorers, metric, guard, user) for c in kept}

    batch_sizes = sorted({1, opts.batch_size})
    per_pass = max(1, -(-opts.rounds // opts.passes))
    bar.stage("measuring latency (one session at a time)", opts.passes * len(kept))
    latency = measure_latency(
        {c.name: _factory(c, task, class_labels, base) for c in kept}, x_eval, batch_sizes,
        rounds=opts.rounds, passes=opts.passes, max_seconds=opts.max_seconds, seed=opts.seed,
        on_round=lambda name, p: bar.advance(detail=f"pass {p + 1}/{opts.passes}: {name}"))
    measurement = _measurement(opts, per_pass, latency)

    results = []
    speed = {c.name: {b: latency_ratio(latency["original"][b], latency[c.name][b])
                      for b in batch_sizes} for c in kept}
    for cand in kept:
        eval_metrics, eval_intervals, evaluation, choice = judged[cand.name]
        diff = compare_outputs(task, outputs["original"][1], outputs[cand.name][1])
        ok_metric = choice.interval.high <= opts.tolerance
        ok_guard = guard is None or (choice.guard_interval is not None and
                                     choice.guard_interval.high <= opts.guard_tolerance)
        verdict = ("ok" if ok_metric and ok_guard else
                   "too lossy" if choice.loss > opts.tolerance else
                   "uncertain" if not ok_metric else "guard")
        results.append(CandidateResult(
            name=cand.name, technique=cand.technique, note=cand.note, recipe=cand.recipe,
            settings=cand.settings, size_bytes=len(cand.onnx_bytes),
            n_parameters=cand.n_parameters, latency=latency[cand.name], metrics=eval_metrics,
            intervals=eval_intervals, evaluation=evaluation, choice=choice,
            max_abs_diff=diff["max_abs_diff"], disagreement=diff["disagreement"],
            within_tolerance=bool(ok_metric and ok_guard), verdict=verdict,
            speedup={b: r.value for b, r in speed[cand.name].items()},
            speedup_interval={b: r.interval for b, r in speed[cand.name].items()},
            candidate=cand,
        ))
    report = OptimizeReport(
        name, version, task, metric, opts.tolerance, batch_sizes,
        {"fit": int(finite.sum()), "choice": len(x_choice), "evaluation": len(x_eval)},
        results, skipped, rejected, guard_metric=guard,
        guard_tolerance=opts.guard_tolerance if guard else None, measurement=measurement,
        contract=contract, metric_direction=_direction(metric, user))
    choose(report, opts)
    return report


def _measurement(opts: OptimizeOptions, per_pass: int,
                 latency: dict[str, dict[int, Latency]]) -> str:
    """How latency was measured, in a sentence for the reports."""
    blocks = [lat for by_batch in latency.values() for lat in by_batch.values()]
    calls = np.concatenate([b.warmup_calls for b in blocks if b.warmup_calls is not None])
    capped = sum(b.unsettled for b in blocks)
    passes = max((len(np.unique(b.passes)) for b in blocks if b.passes is not None),
                 default=opts.passes)
    return (f"one ONNX Runtime session alive at a time; {passes} interleaved passes, the order "
            f"drawn at random and mirrored in the next pass; each pass loads every model in "
            f"turn, warms it until the median of its latest calls moves by less than "
            f"{SETTLE:.0%} (at most {WARM_SECONDS:g} s; here {int(calls.min())} to "
            f"{int(calls.max())} calls"
            + (f", {capped} of {calls.size} warm-ups stopped by that limit" if capped else "")
            + f"), times {per_pass} calls per batch size and releases it")


def _runs_as_original(cand: Candidate, model: bytes, base: RuntimeSettings) -> bool:
    """Same bytes under the same effective settings: the original itself, whatever its name."""
    return cand.onnx_bytes == model and cand.runtime_settings(base) == base


def _why_rejected(cand: Candidate, allowed_bad: int, ref: tuple[Outputs, Outputs],
                  pair: tuple[Outputs, Outputs]) -> str | None:
    why = rejection(cand.onnx_bytes, allowed_weights=allowed_bad)
    if why:
        return why
    for (r, o), rows in zip(zip(ref, pair, strict=True), ("choice", "evaluation"), strict=True):
        bad = nonfinite_outputs(r.scores, o.scores)
        if bad:
            return (f"answers NaN or infinity on {bad} of {len(o.scores)} {rows} rows where the "
                    "original answers a number")
    return None


def _factory(cand: Candidate, task: str, labels: list[Any] | None,
             base: RuntimeSettings) -> Callable[[], ModelRunner]:
    def build() -> ModelRunner:
        return ModelRunner(cand.onnx_bytes, task=task, class_labels=labels,
                           settings=cand.runtime_settings(base), name=cand.name)
    return build


def _guard_metric(opts: OptimizeOptions, task: str, metric: str, reference: Outputs,
                  scorer: _Scorer) -> str | None:
    """The second bound: by default a proper score (log loss) for probabilistic classifiers,
    so a candidate cannot keep accuracy while ruining its probabilities."""
    requested = opts.guard_metric
    if requested in (None, "", "none"):
        return None
    if requested == "auto":
        if task != "classification" or metric in PROPER_SCORES:
            return None
        return "log_loss" if scorer.rows("log_loss", reference) is not None else None
    guard = primary_metric(task, requested)
    if guard == metric:
        raise InvalidInput(f"the guard metric must differ from the metric ({metric})")
    if scorer.rows(guard, reference) is None:
        raise InvalidInput(f"guard metric '{guard}' does not apply to this model's outputs "
                           "(log loss and Brier need probabilities; ROC AUC two classes)")
    return guard


def _judge(name: str, outputs: dict[str, tuple[Outputs, Outputs]], scorers: list[_Scorer],
           metric: str, guard: str | None, user: UserMetric | None
           ) -> tuple[dict[str, float], dict[str, Interval], Judgement, Judgement]:
    """Metrics on the evaluation rows, and relative losses on choice and evaluation rows."""
    judgements = []
    eval_metrics: dict[str, float] = {}
    eval_intervals: dict[str, Interval] = {}
    for k, scorer in enumerate(scorers):
        ref, out = outputs["original"][k], outputs[name][k]
        losses: dict[str, tuple[float, Interval]] = {}
        names = [metric] + ([guard] if guard else [])
        if k == 1:
            extra = (["accuracy", *PROPER_SCORES, "roc_auc"] if scorer.task == "classification"
                     else ["rmse"])
            names += [m for m in extra if m not in names]
        for m in names:
            rows_out, rows_ref = scorer.rows(m, out), scorer.rows(m, ref)
            if rows_out is None or rows_ref is None:
                if m in (metric, guard):
                    losses[m] = (float("inf"), Interval(float("inf"), float("inf")))
                continue
            reps_out = scorer.resamples.replicates(rows_out)
            if k == 1:
                eval_metrics[m] = scorer.value(rows_out)
                eval_intervals[m] = interval(reps_out)
            if m in (metric, guard):
                direction = _direction(m, user)
                base_value, value = scorer.value(rows_ref), scorer.value(rows_out)
                point = float((base_value - value) * direction / max(abs(base_value), 1e-12))
                reps = relative_loss_replicates(direction, scorer.resamples.replicates(rows_ref),
                                                reps_out)
                losses[m] = (point, interval(reps))
        loss, ci = losses[metric]
        g = losses.get(guard) if guard else None
        judgements.append(Judgement(loss, ci, g[0] if g else None, g[1] if g else None))
    return eval_metrics, eval_intervals, judgements[1], judgements[0]


def choose(report: OptimizeReport, opts: OptimizeOptions) -> CandidateResult | None:
    """The fastest candidate within tolerance on the choice rows (by its interval) whose
    speed-up clears ``min_speedup`` by the lower end of its paired interval, if the evaluation
    rows confirm it; sets ``report.chosen`` and ``report.reason``.

    Candidates the measurement cannot tell apart from the fastest (their paired ratio to it
    does not clear ``max(min_speedup, DISTINCT_SPEED)``) are marked as tied with it, and the
    pick among them is the smallest, then the one changing the fewest runtime settings: noise
    must not decide which of several equal candidates becomes the next version."""
    batch = max(report.batch_sizes)
    q = 50.0 if opts.rank_by == "p50" else 99.0
    original = report.result("original")
    gains = {r.name: _speedup(original, r, batch, q) for r in report.results}
    eligible = [r for r in report.results if r.name != "original" and r.within_tolerance]
    if not eligible:
        uncertain = [r.name for r in report.results if r.verdict == "uncertain"]
        report.reason = (f"no candidate is within {report.tolerance:.2%} relative "
                         f"{report.metric} loss by the worse end of its 95% interval on the "
                         f"{report.rows['choice']} choice rows; the original stays")
        if uncertain:
            report.reason += (f" ({', '.join(uncertain)} look close, but the data are too few "
                              "to tell: pass more rows)")
        guarded = [r.name for r in report.results if r.verdict == "guard"]
        if guarded:
            report.reason += (f"; {', '.join(guarded)} stay within the {report.metric} "
                              f"tolerance but worsen {report.guard_metric} by more than "
                              f"{opts.guard_tolerance:.0%} (--guard-tolerance)")
        return None
    fastest = max(eligible, key=lambda r: gains[r.name].value)
    distinct = max(opts.min_speedup, DISTINCT_SPEED)
    for r in eligible:
        if r is not fastest and not _speedup(r, fastest, batch, q).clears(distinct):
            r.tied_with = fastest.name
    clearing = [r for r in eligible if gains[r.name].clears(opts.min_speedup)]
    if not clearing:
        report.reason = (f"the fastest candidate within tolerance ({fastest.name}) has a "
                         f"speed-up of {gains[fastest.name].text()} ({opts.rank_by}) at batch "
                         f"{batch}; registering needs the interval's lower end to reach "
                         f"{opts.min_speedup:.2f}x (--min-speedup), so no faster version is "
                         "shown beyond the machine's noise: the original stays")
        return None
    best = max(clearing, key=lambda r: gains[r.name].value)
    tied = [best] + [r for r in clearing if r is not best
                     and not _speedup(r, best, batch, q).clears(distinct)]
    best = min(tied, key=lambda r: (r.size_bytes, len(r.settings), r.name))
    for r in eligible:
        r.tied_with = None if r is best else (
            best.name if r in tied else r.tied_with)
    ev = best.evaluation
    confirmed = ev.interval.high <= opts.tolerance and (
        report.guard_metric is None or (ev.guard_interval is not None and
                                        ev.guard_interval.high <= opts.guard_tolerance))
    if not confirmed:
        report.reason = (f"{best.name} was picked on the choice rows, but on the "
                         f"{report.eval_rows} evaluation rows its relative {report.metric} loss "
                         f"is {ev.loss:+.2%} (95% interval {ev.interval.low:+.2%} to "
                         f"{ev.interval.high:+.2%})" + _guard_text(report, ev) +
                         f": not confirmed within {report.tolerance:.2%}"
                         + (f" / {report.guard_metric} within {opts.guard_tolerance:.2%}"
                            if report.guard_metric else "")
                         + " — the data are too few or the candidate too lossy; the original "
                         "stays")
        return None
    report.chosen = best.name
    others = [r.name for r in tied if r is not best]
    report.reason = (f"{best.name}: {gains[best.name].text()} faster ({opts.rank_by}) at batch "
                     f"{batch}; on the evaluation rows relative {report.metric} loss "
                     f"{ev.loss + 0.0:+.2%} (95% interval {ev.interval.low:+.2%} to "
                     f"{ev.interval.high:+.2%})" + _guard_text(report, ev)
                     + (f"; as fast within noise: {', '.join(others)} (the smallest, with the "
                        "fewest runtime settings changed, is chosen)" if others else ""))
    return best


def _speedup(slow: CandidateResult, fast: CandidateResult, batch: int, q: float) -> Ratio:
    """How many times faster ``fast`` is than ``slow``, paired pass by pass."""
    return latency_ratio(slow.latency[batch], fast.latency[batch], q)


def _guard_text(report: OptimizeReport, ev: Judgement) -> str:
    if report.guard_metric is None or ev.guard_interval is None or ev.guard_loss is None:
        return ""
    return (f", {report.guard_metric} loss {ev.guard_loss + 0.0:+.2%} (interval "
            f"{ev.guard_interval.low:+.2%} to {ev.guard_interval.high:+.2%})")


def _params(data: bytes) -> int:
    import onnx

    return parameter_count(onnx.load_from_string(data))
