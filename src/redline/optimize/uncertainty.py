"""How sure a metric is: bootstrap intervals on the evaluation rows, paired across models.

A "-0.16% RMSE" on 750 rows whose own 95% interval is +-2.3% says nothing; every figure the
optimizer and the gate print carries its interval, and "within tolerance" means the interval's
worse end is within tolerance. Resamples are drawn once per row set and shared by every model
(paired), so the interval of a *difference* between two models is as tight as their outputs
are close: two models with identical outputs differ by exactly zero in every resample.

Poisson(1) row weights stand in for multinomial resampling (the usual large-sample shortcut);
they make every mean-type metric one matrix product over all resamples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def to_list(self) -> list[float]:
        return [round(self.low, 6), round(self.high, 6)]


@dataclass
class MetricRows:
    """A metric that can be recomputed on any resample of the rows.

    Mean-type metrics (accuracy, log loss, Brier, squared error) keep ``per_row`` values and a
    ``finish`` applied to their weighted mean (``sqrt`` for RMSE); others (ROC AUC, a user's
    function) keep ``on_rows``, called with the row indices of each resample.
    """

    per_row: np.ndarray | None = None
    finish: Callable[[np.ndarray], np.ndarray] = np.asarray
    on_rows: Callable[[np.ndarray], float] | None = None


class Resamples:
    """One fixed set of bootstrap resamples of ``n`` rows, shared by every model (paired)."""

    def __init__(self, n: int, count: int = 500, seed: int = 0) -> None:
        self.n = n
        self.count = count
        rng = np.random.default_rng(seed)
        self.weights = rng.poisson(1.0, size=(count, n)).astype(np.float32)
        self.weights[self.weights.sum(axis=1) == 0, 0] = 1.0  # an empty resample has no mean

    def replicates(self, rows: MetricRows) -> np.ndarray:
        """The metric on every resample."""
        if rows.per_row is not None:
            values = np.asarray(rows.per_row, dtype=np.float64)
            means = (self.weights @ values) / self.weights.sum(axis=1)
            return np.asarray(rows.finish(means), dtype=np.float64)
        assert rows.on_rows is not None
        counts = self.weights.astype(np.int64)
        index = np.arange(self.n)
        out = np.empty(self.count)
        for r in range(self.count):
            out[r] = rows.on_rows(np.repeat(index, counts[r]))
        return out


def interval(replicates: np.ndarray, level: float = LEVEL) -> Interval:
    finite = replicates[np.isfinite(replicates)]
    if finite.size == 0:
        return Interval(float("nan"), float("nan"))
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return Interval(float(low) + 0.0, float(high) + 0.0)  # + 0.0: no -0.0 to print


def relative_loss_replicates(direction: int, baseline: np.ndarray,
                             candidate: np.ndarray) -> np.ndarray:
    """Paired relative loss per resample (positive = the candidate is worse)."""
    return (baseline - candidate) * direction / np.maximum(np.abs(baseline), 1e-12)


def share_interval(flags: np.ndarray, resamples: Resamples) -> Interval:
    """Interval of a share of rows (e.g. rows whose answer changed)."""
    return interval(resamples.replicates(MetricRows(per_row=flags.astype(np.float64))))
