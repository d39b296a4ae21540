"""One feature's training distribution, as the version's profile stores it, and its thresholds.

A numeric feature is known by its decile histogram and quantiles (from which a piecewise-linear
quantile function is rebuilt, for Wasserstein and for drawing reference windows); a categorical
one by its category shares, plus an "unseen" bin for categories training never had.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from redline.monitoring.drift.calibration import (
    share_thresholds,
    size_class,
    wasserstein_noise,
    wasserstein_threshold,
)
from redline.monitoring.drift.stats import (
    QUANTILE_GRID,
    Shares,
    js_distance,
    psi,
    sorted_quantiles,
)


@dataclass
class FeatureReference:
    """One feature's training distribution, as the profile stores it."""

    name: str
    kind: str  # numeric | categorical
    ref_p: np.ndarray  # shares per bin (numeric) or per category + "other" (categorical)
    inner_edges: np.ndarray = field(default_factory=lambda: np.zeros(0))
    u_points: np.ndarray = field(default_factory=lambda: np.zeros(0))  # quantile function knots
    v_points: np.ndarray = field(default_factory=lambda: np.zeros(0))
    categories: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lo: float = -math.inf
    hi: float = math.inf
    scale: float = 1.0
    missing_share: float = 0.0
    ref_rows: int = 0  # rows behind the profile (0: unknown, taken as exact)
    integer: bool = False  # integer-valued: the quantile function is a step, not a line
    _thresholds: dict[int, dict[str, float]] = field(default_factory=dict)
    _w1000: float | None = None

    @classmethod
    def from_profile(cls, name: str, prof: dict[str, Any], levels: list[float],
                     rows: int = 0) -> FeatureReference:
        missing = float(prof.get("missing_share", 0.0))
        ref_rows = int(rows * (1 - missing))
        cats = prof.get("categories")
        if cats:
            values = np.array([float(k) for k in cats])
            shares = np.array([float(v) for v in cats.values()])
            order = np.argsort(values)
            ref_p = np.append(shares[order] / shares.sum(), 0.0)  # last: unseen categories
            return cls(name, "categorical", ref_p, categories=values[order],
                       lo=float(values.min()), hi=float(values.max()), missing_share=missing,
                       ref_rows=ref_rows, integer=True)
        hist = prof["histogram"]
        edges = np.asarray(hist["edges"], dtype=np.float64)
        counts = np.asarray(hist["counts"], dtype=np.float64)
        ref_p = counts / counts.sum() if counts.sum() else np.ones(1)
        # The quantile function, piecewise linear through the profile's quantiles and the
        # histogram's cumulative shares (more knots, more faithful Wasserstein).
        u = list(levels) + list(np.concatenate([[0.0], np.cumsum(ref_p)]))
        v = list(prof["quantiles"]) + list(edges if edges.size == ref_p.size + 1
                                           else [edges[0]] * (ref_p.size + 1))
        order = np.lexsort((np.asarray(v), np.asarray(u)))
        u_arr, v_arr = np.asarray(u)[order], np.maximum.accumulate(np.asarray(v)[order])
        std = float(prof.get("std", 0.0))
        q = prof["quantiles"]
        iqr = float(np.interp(0.75, levels, q) - np.interp(0.25, levels, q))
        scale = std if std > 0 else (iqr if iqr > 0 else 1.0)
        return cls(name, "numeric", ref_p, inner_edges=edges[1:-1], u_points=u_arr,
                   v_points=v_arr, lo=float(edges[0]), hi=float(edges[-1]), scale=scale,
                   missing_share=missing, ref_rows=ref_rows, integer=bool(prof.get("integer")))

    # ------------------------------------------------------------------ live values -> shares
    def shares(self, x: np.ndarray) -> np.ndarray:
        """Live values' shares over the reference's bins (categorical: categories + unseen)."""
        live = Shares(self.ref_p.size)
        if self.kind == "numeric":
            live.update(np.searchsorted(self.inner_edges, x, side="right"))
        else:
            pos = np.searchsorted(self.categories, x)
            pos = np.clip(pos, 0, self.categories.size - 1)
            known = self.categories[pos] == x
            live.update(np.where(known, pos, self.categories.size))
        return live.get()

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` values drawn from the reference (for the threshold calibration)."""
        if self.kind == "numeric":
            values = np.interp(rng.random(n), self.u_points, self.v_points)
            return np.floor(values) if self.integer else values
        idx = rng.choice(self.categories.size, size=n, p=self.ref_p[:-1] / self.ref_p[:-1].sum())
        return self.categories[idx]

    def reference_quantiles(self) -> np.ndarray:
        # For integers the knots are (P(X < k), k): between two knots the quantile is still k.
        ref = np.interp(QUANTILE_GRID, self.u_points, self.v_points)
        return np.floor(ref) if self.integer else ref

    def wasserstein(self, x: np.ndarray) -> float:
        """Between ``x`` (sorted ascending) and the reference, in reference scales."""
        live = sorted_quantiles(x, QUANTILE_GRID, self.integer)
        ref = self.reference_quantiles()
        return float(np.mean(np.abs(live - ref)) / self.scale)

    def statistics(self, x: np.ndarray, presorted: bool = False) -> dict[str, float]:
        """PSI, JS and (numeric) Wasserstein of finite live values ``x`` against the reference
        (``presorted``: ``x`` is already sorted ascending).

        A numeric feature's values are sorted once: its bin shares are then a search of each
        bin edge in them, its Wasserstein quantiles read off them (``sorted_quantiles``)."""
        if self.kind == "numeric":
            ordered = x if presorted else np.sort(x)
            # values below each inner edge: a value equal to an edge is in the bin above it,
            # as ``shares``' searchsorted(side="right") places it
            below = np.searchsorted(ordered, self.inner_edges, side="left")
            counts = np.diff(np.concatenate(([0], below, [ordered.size]))).astype(np.float64)
            p = counts / max(1.0, counts.sum())
        else:
            p = self.shares(x)
        out = {"psi": psi(p, self.ref_p), "js": js_distance(p, self.ref_p)}
        if self.kind == "numeric":
            out["wasserstein"] = self.wasserstein(ordered)
        return out

    # ------------------------------------------------------------------ thresholds
    def thresholds(self, n: int) -> dict[str, float]:
        """Effect-size thresholds for a window of ``n`` rows (cached per size class).

        The noise part is the 99.9th percentile (Wasserstein: 99.75th) of the statistic over
        windows of that size drawn from the reference itself: bin shares by multinomial draws
        (exact for PSI and JS), and
        Wasserstein from 1,000-row draws scaled to the window's size. The reference side is
        redrawn too (it is a sample of ``ref_rows``), so a small training profile widens them.
        """
        return self.class_thresholds(size_class(n))

    def calibration(self) -> dict[str, Any]:
        """Every threshold computed so far, as JSON (kept beside the version)."""
        return {"w1000": self._w1000,
                "classes": {str(size): dict(t) for size, t in self._thresholds.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        """Take thresholds computed before for this very reference (``calibration``)."""
        w1000 = state.get("w1000")
        self._w1000 = None if w1000 is None else float(w1000)
        self._thresholds = {int(size): {k: float(v) for k, v in t.items()}
                            for size, t in state.get("classes", {}).items()}

    def class_thresholds(self, size: int) -> dict[str, float]:
        """``thresholds`` for the window size class ``size`` (one of ``size_classes``)."""
        cached = self._thresholds.get(size)
        if cached is not None:
            return cached
        rng = np.random.default_rng(size)  # one random stream per class: the same every run
        out = share_thresholds(rng, self.ref_p / self.ref_p.sum(), size, self.ref_rows)
        if self.kind == "numeric":
            if self._w1000 is None:  # the noise at 1,000 rows, once; every class scales it
                self._w1000 = wasserstein_noise(rng, self)
            out["wasserstein"] = wasserstein_threshold(self._w1000, size, self.ref_rows)
        self._thresholds[size] = out
        return out
