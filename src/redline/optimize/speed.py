"""How sure a speed-up is: a paired interval over the interleaved latency passes.

Each pass times every model once, one after another, so whatever the machine does during that
pass (a noisy neighbour, a clock-frequency change) falls on both models of a pair; the ratio of
their per-pass medians is one paired observation. The speed-up is the geometric mean of those
ratios and its 95% interval a Student-t interval on their logarithms. With few passes the
interval is wide unless every pass agrees: a ratio that noise alone can produce is no speed-up.
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


def latency_ratio(numerator: Latency, denominator: Latency, q: float = 50.0) -> Ratio:
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
    return Ratio(float(np.exp(centre)),
                 Interval(float(np.exp(centre - half)), float(np.exp(centre + half))), len(logs))


def _by_pass(latency: Latency, q: float) -> dict[int, float]:
    floor = 1e-3  # µs: a timer that read zero must not become log(0)
    if latency.passes is None:
        return {0: max(float(np.percentile(latency.samples_us, q)), floor)}
    passes = np.unique(latency.passes)
    return {int(p): max(float(v), floor) for p, v in zip(passes, latency.per_pass(q),
                                                          strict=True)}
