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

This module is the run, phase by phase; each phase is its own module: ``build.py`` (the
candidates), ``screen.py`` (which may be measured), ``judge.py`` (their losses against the
original), ``choice.py`` (the pick), with ``options.py`` and ``results.py`` for what goes in
and what comes out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.config import RuntimeSettings
from redline.errors import InvalidInput
from redline.optimize.build import build_candidates, runner_factory
from redline.optimize.candidates import TuneContext
from redline.optimize.choice import DISTINCT_SPEED, choose
from redline.optimize.contract import answers_rows, io_contract, missing_value_probe
from redline.optimize.judge import Scorer, direction, guard_metric, judge, verdict
from redline.optimize.options import TECHNIQUES, OptimizeOptions, Progress, Silent, Technique
from redline.optimize.profile import (
    SETTLE,
    WARM_SECONDS,
    Latency,
    ModelRunner,
    compare_outputs,
    measure_latency,
    primary_metric,
)
from redline.optimize.results import CandidateResult, Judgement, OptimizeReport
from redline.optimize.safety import check_data, finite_rows, nonfinite_weights
from redline.optimize.screen import screen
from redline.optimize.speed import latency_ratio
from redline.optimize.uncertainty import Resamples

__all__ = [
    "DISTINCT_SPEED",
    "TECHNIQUES",
    "CandidateResult",
    "Judgement",
    "OptimizeOptions",
    "OptimizeReport",
    "Progress",
    "Technique",
    "choose",
    "optimize",
    "split",
]


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
    bar: Progress = progress or Silent()
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
    candidates, skipped = build_candidates(model, ctx, opts.techniques, base, bar)
    del original, ctx  # the teacher's session too: from here on, one session at a time

    allowed_bad, _ = nonfinite_weights(model)
    outputs, unloaded, rejected = screen(
        candidates, lambda c: runner_factory(c, task, class_labels, base)(), (x_choice, x_eval),
        contract, probe, answered, allowed_bad, bar)
    skipped += unloaded
    kept = [c for c in candidates if c.name in outputs]

    scorers = [Scorer(task, yy, class_labels, user, Resamples(len(yy), opts.bootstrap, seed=k))
               for k, yy in enumerate((y_choice, y_eval))]
    guard = guard_metric(opts, task, metric, outputs["original"][1], scorers[1])
    judged = {c.name: judge(c.name, outputs, scorers, metric, guard, user) for c in kept}

    batch_sizes = sorted({1, opts.batch_size})
    per_pass = max(1, -(-opts.rounds // opts.passes))
    bar.stage("measuring latency (one session at a time)", opts.passes * len(kept))
    latency = measure_latency(
        {c.name: runner_factory(c, task, class_labels, base) for c in kept}, x_eval,
        batch_sizes, rounds=opts.rounds, passes=opts.passes, max_seconds=opts.max_seconds,
        seed=opts.seed,
        on_round=lambda name, p: bar.advance(detail=f"pass {p + 1}/{opts.passes}: {name}"))
    measurement = _measurement(opts, per_pass, latency)

    results = []
    speed = {c.name: {b: latency_ratio(latency["original"][b], latency[c.name][b])
                      for b in batch_sizes} for c in kept}
    for cand in kept:
        eval_metrics, eval_intervals, evaluation, choice = judged[cand.name]
        diff = compare_outputs(task, outputs["original"][1], outputs[cand.name][1])
        within, label = verdict(choice, opts, guard)
        results.append(CandidateResult(
            name=cand.name, technique=cand.technique, note=cand.note, recipe=cand.recipe,
            settings=cand.settings, size_bytes=len(cand.onnx_bytes),
            n_parameters=cand.n_parameters, latency=latency[cand.name], metrics=eval_metrics,
            intervals=eval_intervals, evaluation=evaluation, choice=choice,
            max_abs_diff=diff["max_abs_diff"], disagreement=diff["disagreement"],
            within_tolerance=within, verdict=label,
            speedup={b: r.value for b, r in speed[cand.name].items()},
            speedup_interval={b: r.interval for b, r in speed[cand.name].items()},
            candidate=cand,
        ))
    report = OptimizeReport(
        name, version, task, metric, opts.tolerance, batch_sizes,
        {"fit": int(finite.sum()), "choice": len(x_choice), "evaluation": len(x_eval)},
        results, skipped, rejected, guard_metric=guard,
        guard_tolerance=opts.guard_tolerance if guard else None, measurement=measurement,
        contract=contract, metric_direction=direction(metric, user))
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
