"""How sure a speed-up is: a paired interval over the interleaved latency passes.

Each pass times every model once, one after another, in an order drawn at random and mirrored
in the next pass, so whatever the machine does during a pair of passes (a noisy neighbour, a
clock-frequency change, a model that leaves the caches cold for the next) falls on both models
of a pair or changes sides from pass to pass; the ratio of their per-pass medians is one paired
observation. The speed-up is the geometric mean of those ratios. Its 95% interval is a bootstrap
over the passes (resampled whole, so drift and order effects stay inside each observation and
widen the interval instead of biasing it), never narrower than the Student-t interval on the
same passes: with few passes a bootstrap alone is too sure of itself. A ratio that noise alone
can produce is no speed-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t

from redline.optimize.profile import Latency
from redline.optimize.uncertainty import LEVEL, Interval

UNKNOWN = Interval(0.0, float("inf"))  # one pass: nothing to pair, so anything is possible


@dataclass(frozen=True)
class Ratio:
    """``slow / fast`` latency ratio (above 1: the second model is faster), with its interval."""

    value: float
    interval: Interval
    passes: int

    def clears(self, threshold: float) -> bool:
        """True only when the whole interval is at or above ``threshold``."""
        return bool(self.interval.low >= threshold)

    def text(self) -> str:
        if not np.isfinite(self.interval.high):
            return f"{self.value:.2f}x (one pass: no interval)"
        return f"{self.value:.2f}x (95% interval {self.interval.low:.2f}x to " \
               f"{self.interval.high:.2f}x over {self.passes} passes)"


def latency_ratio(numerator: Latency, denominator: Latency, q: float = 50.0, *,
                  resamples: int = 2000, seed: int = 0) -> Ratio:
    """How many times ``numerator``'s ``q``-th percentile latency is ``denominator``'s, paired
    pass by pass (``latency_ratio(original, candidate)`` is the candidate's speed-up)."""
    top, bottom = _by_pass(numerator, q), _by_pass(denominator, q)
    shared = sorted(top.keys() & bottom.keys())
    logs = np.log([top[p] for p in shared]) - np.log([bottom[p] for p in shared])
    centre = float(np.mean(logs))
    if len(logs) < 2:
        return Ratio(float(np.exp(centre)), UNKNOWN, len(logs))
    half = float(student_t.ppf(0.5 + LEVEL / 2, len(logs) - 1)
                 * np.std(logs, ddof=1) / np.sqrt(len(logs)))
    rows = np.random.default_rng(seed).integers(0, len(logs), size=(resamples, len(logs)))
    tail = (1.0 - LEVEL) / 2 * 100
    boot_low, boot_high = np.percentile(logs[rows].mean(axis=1), [tail, 100 - tail])
    low, high = min(centre - half, float(boot_low)), max(centre + half, float(boot_high))
    return Ratio(float(np.exp(centre)), Interval(float(np.exp(low)), float(np.exp(high))),
                 len(logs))


def _by_pass(latency: Latency, q: float) -> dict[int, float]:
    floor = 1e-3  # µs: a timer that read zero must not become log(0)
    if latency.passes is None:
        return {0: max(float(np.percentile(latency.samples_us, q)), floor)}
    passes = np.unique(latency.passes)
    return {int(p): max(float(v), floor) for p, v in zip(passes, latency.per_pass(q),
                                                          strict=True)}
