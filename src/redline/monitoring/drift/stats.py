"""The statistics drift is measured with: small, and mergeable where they count.

``Shares`` and ``Rate`` count, so two windows (two workers, two stretches of time) merge by
adding their counts with ``+=`` and read as if they had been one. PSI and the Jensen-Shannon
distance compare two share vectors; ``psi_rows``/``js_rows`` are the same two statistics, one per
row of a matrix of shares (the calibration computes thousands at a time).
"""

from __future__ import annotations

import math

import numpy as np

_EPS = 1e-4  # an empty bin's share in PSI, so that a bin seen on one side only stays finite

# Quantile levels for Wasserstein, the outer 1% of each tail left out: the profile knows the
# extremes only as one min and one max, too coarse to compare tails against.
QUANTILE_GRID = 0.01 + 0.98 * (np.arange(200) + 0.5) / 200


def sorted_quantiles(ordered: np.ndarray, levels: np.ndarray, integer: bool = False
                     ) -> np.ndarray:
    """``np.quantile(ordered, levels)`` of values already sorted ascending (finite), the same
    numbers: numpy's default "linear" method, or "inverted_cdf" when ``integer`` (the first
    value whose cumulative share reaches the level). Read straight from the order statistics:
    ``np.quantile`` partitions again around every level, several times the sort's cost at the
    200 levels of ``QUANTILE_GRID`` (a drift report's Wasserstein, once per feature).

    >>> x = np.array([1.0, 2.0, 4.0, 8.0])
    >>> levels = np.array([0.1, 0.5, 0.9])
    >>> sorted_quantiles(x, levels).tolist() == np.quantile(x, levels).tolist()
    True
    >>> sorted_quantiles(x, levels, integer=True).tolist()
    [1.0, 2.0, 8.0]
    """
    n = ordered.size
    if integer:
        index = n * levels - 1
        below = np.floor(index)
        at = np.where(index - below == 0, below, below + 1).astype(np.intp)
        at[at < 0] = 0
        return ordered[at]
    virtual = (n - 1) * levels
    lower = np.floor(virtual)
    upper = lower + 1
    top = virtual >= n - 1
    lower[top] = upper[top] = -1  # the last value (numpy's bounds, kept for the same gamma)
    bottom = virtual < 0
    lower[bottom] = upper[bottom] = 0
    lo, hi = lower.astype(np.intp), upper.astype(np.intp)
    a, b = ordered[lo], ordered[hi]
    gamma = virtual - lo
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)  # numpy's lerp
    return out


class Shares:
    """Values counted per bin, read as each bin's share of them; ``+=`` adds another's counts.

    ``update`` takes bin indices (``0 .. bins - 1``; a larger one adds bins up to it).

    >>> live = Shares(3)
    >>> live.update(np.array([0, 2, 2, 2]))
    >>> live.get().tolist()
    [0.25, 0.0, 0.75]
    >>> later = Shares(3)
    >>> later.update(np.array([1, 1, 1, 1]))
    >>> live += later
    >>> live.get().tolist()
    [0.125, 0.5, 0.375]
    >>> Shares(2).get().tolist()  # nothing counted yet
    [0.0, 0.0]
    """

    def __init__(self, bins: int) -> None:
        self.counts = np.zeros(bins)

    def update(self, bin_index: np.ndarray) -> None:
        self._add(np.bincount(bin_index, minlength=self.counts.size))

    def get(self) -> np.ndarray:
        return self.counts / max(1.0, self.counts.sum())

    def __iadd__(self, other: Shares) -> Shares:
        self._add(other.counts)
        return self

    def _add(self, counts: np.ndarray) -> None:
        if counts.size > self.counts.size:  # more bins on the other side: ours grow to match
            self.counts = np.pad(self.counts, (0, counts.size - self.counts.size))
        self.counts[: counts.size] += counts


class Rate:
    """The share of values that meet a condition (missing, out of range); ``+=`` merges two.

    >>> rate = Rate()
    >>> rate.update(np.array([True, False, False, False]))
    >>> rate.get()
    0.25
    >>> other = Rate()
    >>> other.update(np.array([True]))
    >>> rate += other
    >>> rate.get(), rate.n
    (0.4, 5)
    >>> Rate().get()  # no values yet
    0.0
    """

    def __init__(self) -> None:
        self.hits = 0
        self.n = 0

    def update(self, flags: np.ndarray) -> None:
        self.hits += int(np.count_nonzero(flags))
        self.n += int(flags.size)

    def get(self) -> float:
        return self.hits / self.n if self.n else 0.0

    def __iadd__(self, other: Rate) -> Rate:
        self.hits += other.hits
        self.n += other.n
        return self


def psi(p: np.ndarray, q: np.ndarray) -> float:
    """Population stability index of live shares ``p`` against reference shares ``q``.

    >>> psi(np.array([0.5, 0.5]), np.array([0.5, 0.5]))
    0.0
    >>> round(psi(np.array([0.6, 0.4]), np.array([0.5, 0.5])), 4)
    0.0405
    """
    p = np.clip(p, _EPS, None)
    q = np.clip(q, _EPS, None)
    return float(np.sum((p - q) * np.log(p / q)))


def js_distance(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon distance, base 2 (0 = same, 1 = disjoint).

    >>> js_distance(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    1.0
    >>> round(js_distance(np.array([0.6, 0.4]), np.array([0.5, 0.5])), 4)
    0.0854
    """
    m = 0.5 * (p + q)

    def kl(a: np.ndarray, b: np.ndarray) -> float:
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / b[mask])))

    return math.sqrt(max(0.0, 0.5 * kl(p, m) + 0.5 * kl(q, m)))


def psi_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """:func:`psi` of each row of ``p`` against the same row of ``q``.

    >>> psi_rows(np.array([[0.5, 0.5], [0.6, 0.4]]), np.array([0.5, 0.5])).round(4).tolist()
    [0.0, 0.0405]
    """
    pc, qc = np.clip(p, _EPS, None), np.clip(q, _EPS, None)
    return np.sum((pc - qc) * np.log(pc / qc), axis=1)


def js_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """:func:`js_distance` of each row of ``p`` against the same row of ``q``.

    >>> js_rows(np.array([[1.0, 0.0], [0.6, 0.4]]), np.array([[0.0, 1.0], [0.5, 0.5]])).round(4)
    array([1.    , 0.0854])
    """
    m = 0.5 * (p + q)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_p = np.nansum(np.where(p > 0, p * np.log2(p / m), 0.0), axis=1)
        kl_q = np.nansum(np.where(q > 0, q * np.log2(q / m), 0.0), axis=1)
    return np.sqrt(np.maximum(0.0, 0.5 * kl_p + 0.5 * kl_q))
