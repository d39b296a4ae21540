"""Two live samples of a model's outputs compared: has the distribution shifted?

A rollout compares the candidate's answers with the baseline's on the same traffic. Neither is
a training profile, so the bins come from the baseline sample itself: its deciles, and each
decile value as a bin of its own (a discrete output such as a class label or a constant piles
up on a few values; a value within the tolerance of one counts as that value, so float noise
in a converted or quantized candidate is not a shift). The statistic is the PSI and the
Jensen-Shannon distance of ``monitoring/drift/stats.py``.

As in drift, the limit is an effect size that noise cannot reach: the larger of a floor (a
shift too small to matter) and the PSI's own noise at these sample sizes. Two samples of one
distribution give ``PSI * n_a n_b / (n_a + n_b)`` about chi-square with (bins - 1) degrees of
freedom. A rollout checks every 25 answers for as long as it runs, each window of answers
new after a few thousand: thousands of checks a day, so the limit is the law's 1 - 1e-9
quantile, not a 99.99th percentile (at which an identical candidate was rolled back: the
test of this module's noise draws fails with it). The shares are taken after half a count is
added to each bin (``SMOOTHING``): with the raw shares, a bin that one sample happens to leave
empty weighs ``ln(share / 1e-4)`` and gives PSI a tail far heavier than the law's. Sizes are
*rows*: the values of one row are not independent draws, and counting rows keeps the limit on
the safe side.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from redline.monitoring.drift.stats import js_distance, psi

DECILES = np.linspace(0.1, 0.9, 9)
Z_LIMIT = 5.998  # standard normal quantile of 1 - 1e-9 (the module's docstring says why)
SMOOTHING = 0.5  # counts added to each bin before its share is taken (Jeffreys' prior)
RTOL, ATOL = 1e-3, 1e-6  # a value this close to a bin's value is that value


def chi2_quantile(df: int, z: float = Z_LIMIT) -> float:
    """Chi-square quantile at the normal quantile ``z`` (Wilson-Hilferty, ~1% off from 5 df)."""
    a = 2.0 / (9.0 * max(1, df))
    return max(1, df) * (1.0 - a + z * math.sqrt(a)) ** 3


def bin_edges(reference: np.ndarray) -> np.ndarray:
    """The reference's distinct deciles: the values between and on which values are binned."""
    return np.unique(np.quantile(reference, DECILES))


def bin_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts over ``2 * len(edges) + 1`` bins: below, on and between the edges."""
    k = edges.size
    below = np.searchsorted(edges, values, side="left")  # edges strictly below each value
    bins = 2 * below
    tol = ATOL + RTOL * np.abs(edges)
    upper = np.minimum(below, k - 1)
    lower = np.maximum(below - 1, 0)
    on_lower = np.abs(values - edges[lower]) <= tol[lower]
    on_upper = np.abs(values - edges[upper]) <= tol[upper]
    bins = np.where(on_lower, 2 * lower + 1, bins)
    bins = np.where(on_upper, 2 * upper + 1, bins)
    return np.bincount(bins, minlength=2 * k + 1).astype(np.float64)


def prediction_shift(reference: np.ndarray, live: np.ndarray, reference_rows: int,
                     live_rows: int, floor: float) -> dict[str, Any]:
    """PSI and JS distance of ``live`` values against ``reference`` values, and the PSI limit
    (``floor`` or the noise at these row counts, whichever is larger)."""
    reference = reference[np.isfinite(reference)]
    live = live[np.isfinite(live)]
    if not reference.size or not live.size:
        return {"psi": 0.0, "js": 0.0, "limit": math.inf, "shifted": False}
    edges = bin_edges(reference)
    p = bin_counts(live, edges)
    q = bin_counts(reference, edges)
    used = (p + q) > 0
    p, q = p[used], q[used]
    value = psi(_shares(p + SMOOTHING), _shares(q + SMOOTHING))
    noise = chi2_quantile(p.size - 1) * (1.0 / max(1, reference_rows) + 1.0 / max(1, live_rows))
    limit = max(floor, noise)
    return {"psi": round(value, 4), "js": round(js_distance(_shares(p), _shares(q)), 4),
            "limit": round(limit, 4), "shifted": bool(value > limit)}


def _shares(counts: np.ndarray) -> np.ndarray:
    return counts / counts.sum()
