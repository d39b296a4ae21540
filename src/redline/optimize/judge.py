"""How far a candidate's answers fall from the original's, by the metric and the guard.

Every figure is taken on rows no technique learned from, with paired bootstrap resamples, so
each loss carries a 95% interval; a candidate is within tolerance only when the interval's
worse end is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.errors import InvalidInput
from redline.optimize.options import OptimizeOptions
from redline.optimize.profile import (
    METRIC_DIRECTION,
    PROPER_SCORES,
    Outputs,
    metric_rows,
    primary_metric,
)
from redline.optimize.results import Judgement
from redline.optimize.uncertainty import (
    Interval,
    MetricRows,
    Resamples,
    interval,
    relative_loss_replicates,
)
from redline.optimize.user_metric import UserMetric


class Scorer:
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


def direction(metric: str, user: UserMetric | None) -> int:
    """+1 when a higher value of ``metric`` is better, -1 when lower is."""
    if user is not None and metric == user.name:
        return user.direction
    return METRIC_DIRECTION[metric]


def guard_metric(opts: OptimizeOptions, task: str, metric: str, reference: Outputs,
                 scorer: Scorer) -> str | None:
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


def judge(name: str, outputs: dict[str, tuple[Outputs, Outputs]], scorers: list[Scorer],
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
                sign = direction(m, user)
                base_value, value = scorer.value(rows_ref), scorer.value(rows_out)
                point = float((base_value - value) * sign / max(abs(base_value), 1e-12))
                reps = relative_loss_replicates(sign, scorer.resamples.replicates(rows_ref),
                                                reps_out)
                losses[m] = (point, interval(reps))
        loss, ci = losses[metric]
        g = losses.get(guard) if guard else None
        judgements.append(Judgement(loss, ci, g[0] if g else None, g[1] if g else None))
    return eval_metrics, eval_intervals, judgements[1], judgements[0]


def verdict(choice: Judgement, opts: OptimizeOptions, guard: str | None) -> tuple[bool, str]:
    """Whether the choice rows put a candidate within tolerance (by its interval's worse end),
    and the verdict: ok | too lossy | uncertain | guard."""
    ok_metric = choice.interval.high <= opts.tolerance
    ok_guard = guard is None or (choice.guard_interval is not None and
                                 choice.guard_interval.high <= opts.guard_tolerance)
    label = ("ok" if ok_metric and ok_guard else
             "too lossy" if choice.loss > opts.tolerance else
             "uncertain" if not ok_metric else "guard")
    return bool(ok_metric and ok_guard), label
