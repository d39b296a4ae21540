"""Drift that tells a shift from noise: effect sizes against the version's reference profile.

Every model version carries a profile of its training inputs (``metadata.input_profile``: per
feature quantiles, a decile histogram, the missing share and, for low-cardinality integer
columns, category shares). The server keeps a bounded rolling window of live rows per version and
compares each feature with its profile:

- PSI and Jensen-Shannon distance (base 2) over the profile's bins, for every feature;
- Wasserstein-1 distance (1% tails trimmed) in reference standard deviations, for numeric ones;
- category shares (and the share of categories never seen in training), for categorical ones;
- the missing-value rate and the out-of-range rate (outside the training min..max).

No p-values: a test's p-value shrinks with the sample, so a large window of unchanged data
alarms on differences too small to matter. Instead each statistic has a threshold that is an
*effect size*: the larger of a floor (a shift small enough to ignore) and the 99.9th percentile
of the statistic on windows of the same size drawn from the reference profile itself (the
statistic's own noise at that size). So a small window does not alarm on noise and a large one
does not alarm on a trivial difference.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from redline.monitoring.handoff import yield_to_loop
from redline.monitoring.threshold_file import ThresholdFile, fingerprint

# Effect-size floors: below these a shift is not worth an alarm however sure we are of it.
PSI_FLOOR = 0.1
JS_FLOOR = 0.1
WASSERSTEIN_FLOOR = 0.1  # in reference standard deviations
RATE_FLOOR = 0.05  # missing / out-of-range rate increase
# The noise part of a threshold: a high percentile of the statistic over reference-drawn windows
# (each feature has two or three statistics, a model tens of features: stay far in the tail).
NULL_QUANTILE = 99.9
NULL_DRAWS = 2000  # bin-share draws (multinomial)
NULL_CHUNK = 250  # of them per chunk of calibration work (~0.3 ms)
W_DRAWS = 400  # Wasserstein draws of 1,000 values each
W_QUANTILE = 99.75
W_CHUNK = 4  # Wasserstein draws per chunk of calibration work (~0.4 ms each; the draws are
# one random stream whatever the chunk, so the thresholds do not depend on it)
_EPS = 1e-4
# Quantile levels for Wasserstein, the outer 1% of each tail left out: the profile knows the
# extremes only as one min and one max, too coarse to compare tails against.
_GRID = 0.01 + 0.98 * (np.arange(200) + 0.5) / 200
# What a calibration's result depends on besides the profile (part of a kept file's fingerprint).
CALIBRATION_CONSTANTS = {"psi_floor": PSI_FLOOR, "js_floor": JS_FLOOR,
                         "wasserstein_floor": WASSERSTEIN_FLOOR, "null_quantile": NULL_QUANTILE,
                         "null_draws": NULL_DRAWS, "w_draws": W_DRAWS, "w_quantile": W_QUANTILE}


# ---------------------------------------------------------------------- statistics
def psi(p: np.ndarray, q: np.ndarray) -> float:
    """Population stability index of live shares ``p`` against reference shares ``q``."""
    p = np.clip(p, _EPS, None)
    q = np.clip(q, _EPS, None)
    return float(np.sum((p - q) * np.log(p / q)))


def js_distance(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon distance, base 2 (0 = same, 1 = disjoint)."""
    m = 0.5 * (p + q)

    def kl(a: np.ndarray, b: np.ndarray) -> float:
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / b[mask])))

    return math.sqrt(max(0.0, 0.5 * kl(p, m) + 0.5 * kl(q, m)))


# ---------------------------------------------------------------------- the reference
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
        if self.kind == "numeric":
            idx = np.searchsorted(self.inner_edges, x, side="right")
            counts = np.bincount(idx, minlength=self.ref_p.size).astype(np.float64)
        else:
            pos = np.searchsorted(self.categories, x)
            pos = np.clip(pos, 0, self.categories.size - 1)
            known = self.categories[pos] == x
            counts = np.bincount(np.where(known, pos, self.categories.size),
                                 minlength=self.ref_p.size).astype(np.float64)
        return counts / max(1.0, counts.sum())

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` values drawn from the reference (for the threshold calibration)."""
        if self.kind == "numeric":
            values = np.interp(rng.random(n), self.u_points, self.v_points)
            return np.floor(values) if self.integer else values
        idx = rng.choice(self.categories.size, size=n, p=self.ref_p[:-1] / self.ref_p[:-1].sum())
        return self.categories[idx]

    def reference_quantiles(self) -> np.ndarray:
        # For integers the knots are (P(X < k), k): between two knots the quantile is still k.
        ref = np.interp(_GRID, self.u_points, self.v_points)
        return np.floor(ref) if self.integer else ref

    def wasserstein(self, x: np.ndarray) -> float:
        live = np.quantile(x, _GRID, method="inverted_cdf" if self.integer else "linear")
        ref = self.reference_quantiles()
        return float(np.mean(np.abs(live - ref)) / self.scale)

    def statistics(self, x: np.ndarray) -> dict[str, float]:
        p = self.shares(x)
        out = {"psi": psi(p, self.ref_p), "js": js_distance(p, self.ref_p)}
        if self.kind == "numeric":
            out["wasserstein"] = self.wasserstein(x)
        return out

    def thresholds(self, n: int) -> dict[str, float]:
        """Effect-size thresholds for a window of ``n`` rows (cached per size class).

        The noise part is the 99.9th percentile (Wasserstein: 99.75th) of the statistic over
        windows of that size drawn from the reference itself: bin shares by multinomial draws
        (exact for PSI and JS), and
        Wasserstein from 1,000-row draws scaled to the window's size. The reference side is
        redrawn too (it is a sample of ``ref_rows``), so a small training profile widens them.
        """
        return self.class_thresholds(_size_class(n))

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
        rng = np.random.default_rng(size)
        q = self.ref_p / self.ref_p.sum()
        p = _multinomials(rng, size, q) / size
        # The profile is itself a sample: compare with a redrawn reference of the same size, so
        # a small training sample's own noise is not taken for drift.
        r = (_multinomials(rng, self.ref_rows, q) / self.ref_rows
             if self.ref_rows else np.broadcast_to(q, p.shape))
        pc, rc = np.clip(p, _EPS, None), np.clip(r, _EPS, None)
        psis = np.sum((pc - rc) * np.log(pc / rc), axis=1)
        m = 0.5 * (p + r)
        with np.errstate(divide="ignore", invalid="ignore"):
            kl_p = np.nansum(np.where(p > 0, p * np.log2(p / m), 0.0), axis=1)
            kl_r = np.nansum(np.where(r > 0, r * np.log2(r / m), 0.0), axis=1)
        jss = np.sqrt(np.maximum(0.0, 0.5 * kl_p + 0.5 * kl_r))
        out = {"psi": max(PSI_FLOOR, float(np.percentile(psis, NULL_QUANTILE))),
               "js": max(JS_FLOOR, float(np.percentile(jss, NULL_QUANTILE)))}
        if self.kind == "numeric":
            if self._w1000 is None:
                # In chunks, each a millisecond or two of numpy, with the GIL offered back
                # between them: this runs beside a serving event loop (DriftMonitor.calibrate).
                ref_q = self.reference_quantiles()
                method: Any = "inverted_cdf" if self.integer else "linear"
                parts = []
                for _ in range(W_DRAWS // W_CHUNK):
                    draws = self.sample(rng, W_CHUNK * 1000).reshape(W_CHUNK, 1000)
                    live = np.quantile(draws, _GRID, axis=1, method=method).T
                    parts.append(np.mean(np.abs(live - ref_q), axis=1) / self.scale)
                    _yield()
                self._w1000 = float(np.percentile(np.concatenate(parts), W_QUANTILE))
            # Its noise shrinks as sqrt(1/n + 1/n_reference): both sides are samples.
            inv = 1 / size + (1 / self.ref_rows if self.ref_rows else 0.0)
            out["wasserstein"] = max(WASSERSTEIN_FLOOR, self._w1000 * math.sqrt(1000 * inv))
        self._thresholds[size] = out
        return out


def _multinomials(rng: np.random.Generator, n: int, q: np.ndarray) -> np.ndarray:
    """``NULL_DRAWS`` multinomial draws of ``n`` over ``q``, in chunks with the GIL offered
    back between them (2,000 draws in one call were 2-5 ms in one piece). The draws are one
    random stream whatever the chunk: the same numbers as one call."""
    parts = []
    for start in range(0, NULL_DRAWS, NULL_CHUNK):
        if start:
            _yield()
        parts.append(rng.multinomial(n, q, size=min(NULL_CHUNK, NULL_DRAWS - start)))
    return np.concatenate(parts)


class CalibrationStopped(Exception):
    """A calibration left unfinished: its server stopped, or the interpreter is exiting."""


# Set when the interpreter exits: a background calibration ends between two chunks instead of
# being cut inside numpy's C++ code, where killing a daemon thread aborts the process.
_EXITING = threading.Event()


def _stop_calibrations_at_exit() -> None:
    _EXITING.set()
    for thread in list(_CALIBRATIONS):
        thread.join(5.0)


_CALIBRATIONS: set[threading.Thread] = set()
atexit.register(_stop_calibrations_at_exit)


def _yield(stop: threading.Event | None = None) -> None:
    """Offer the GIL to other threads (the event loop) between two chunks of numpy work: on
    the tick's thread (a prediction baseline's first thresholds, in a report) a hand-over
    that waits for the loop; elsewhere (the background calibration) ``sleep(0)``. Raises
    :class:`CalibrationStopped` once the interpreter exits or ``stop`` is set."""
    if _EXITING.is_set() or (stop is not None and stop.is_set()):
        raise CalibrationStopped
    if not yield_to_loop():
        time.sleep(0)


def size_classes(capacity: int) -> list[int]:
    """Every window size class a window of ``capacity`` rows goes through while it fills."""
    sizes = [100]
    while sizes[-1] * 1.5 <= capacity:
        sizes.append(int(sizes[-1] * 1.5))
    return sizes


def _calibrate_all(refs: list[FeatureReference], capacity: int,
                   stop: threading.Event | None = None) -> None:
    """Every size class's thresholds of ``refs``, a class and feature at a time (until
    ``stop`` is set: then :class:`CalibrationStopped`)."""
    for size in size_classes(capacity):
        for ref in refs:
            # by class, not ``thresholds(size)``: a class is int(1.5 x the last), so
            # ``_size_class(size)`` is often the class below it, and the classes left out were
            # computed in the first report that needed them (~4 ms a feature)
            ref.class_thresholds(size)
            _yield(stop)


def _size_class(n: int) -> int:
    """Window sizes rounded down to 1.5x steps, so calibrations are reused as a window fills."""
    size = 100
    while size * 1.5 <= n:
        size = int(size * 1.5)
    return size


def _rate_threshold(base: float, n: int) -> float:
    return base + max(RATE_FLOOR, 4.0 * math.sqrt(max(base * (1 - base), 1e-4) / max(n, 1)))


# ---------------------------------------------------------------------- the live window
class RollingWindow:
    """The last ``capacity`` rows of a fixed width, in a ring buffer (bounded memory)."""

    def __init__(self, width: int, capacity: int) -> None:
        self.data = np.full((capacity, width), np.nan)
        self.capacity = capacity
        self.pos = 0
        self.size = 0
        self.seen = 0
        self.started = time.time()

    def add(self, rows: np.ndarray) -> None:
        rows = rows[-self.capacity:]
        n = rows.shape[0]
        end = self.pos + n
        if end <= self.capacity:
            self.data[self.pos:end] = rows
        else:
            first = self.capacity - self.pos
            self.data[self.pos:] = rows[:first]
            self.data[: n - first] = rows[first:]
        self.pos = end % self.capacity
        self.size = min(self.capacity, self.size + n)
        self.seen += n

    def rows(self) -> np.ndarray:
        return self.data[: self.size] if self.size < self.capacity else self.data


# ---------------------------------------------------------------------- one model version
class DriftMonitor:
    """Live inputs (and predictions) of one model version against its reference profile."""

    def __init__(self, model: str, version: str, profile: dict[str, Any],
                 feature_names: list[str] | None, window_rows: int = 5000,
                 min_rows: int = 200, keep_in: Path | None = None) -> None:
        """``keep_in``: the version's folder, where calibrated thresholds are kept and found."""
        self.model, self.version = model, version
        self.min_rows = min_rows
        levels = profile.get("quantile_levels", [])
        feats = profile.get("features", {})
        names = feature_names or list(feats)
        self.names = names
        self.references: dict[int, FeatureReference] = {}
        for i, name in enumerate(names):
            prof = feats.get(name)
            if prof and "histogram" in prof:
                self.references[i] = FeatureReference.from_profile(name, prof, levels,
                                                                   int(profile.get("rows", 0)))
        self.window = RollingWindow(len(names), window_rows)
        self.predictions = RollingWindow(1, window_rows)
        self.prediction_ref: FeatureReference | None = None
        self._baseline: list[np.ndarray] = []
        self._baseline_rows = 0
        self._baseline_target = window_rows
        self.skipped = 0  # rows whose width did not match the profile
        self._lock = threading.Lock()
        self._calibrated = threading.Event()
        self._calibration: threading.Thread | None = None
        self._stop = threading.Event()  # stop_calibration: end the background calibration
        self._prediction_calibrated = False  # every size class of the baseline's thresholds
        self.calibration_s: float | None = None  # how long the calibration took (CPU time)
        self.thresholds_from: str | None = None  # "file" (kept beside the version) | "computed"
        self._file = None if keep_in is None else ThresholdFile(
            keep_in, fingerprint(profile, names, window_rows, CALIBRATION_CONSTANTS))
        self.last_report: dict[str, Any] | None = None
        self._bounds: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def has_reference(self) -> bool:
        return bool(self.references)

    # ------------------------------------------------------------------ calibration
    def calibrate(self, background: bool = True) -> None:
        """Work out every feature's thresholds for every window size now, so no report pays
        for it (left to the first report, it costs ~0.6 s of CPU for three features, on the
        thread that asked). In the background (a daemon thread, in small chunks that give the
        GIL back), or here and now with ``background=False``. Idempotent."""
        with self._lock:
            if self._calibration is not None or self._calibrated.is_set():
                return
            if not background:
                self._calibration = threading.current_thread()
        if not background:
            self._calibrate()
            return
        thread = threading.Thread(target=self._calibrate, daemon=True,
                                  name=f"redline-drift-calibration-{self.model}-{self.version}")
        self._calibration = thread
        _CALIBRATIONS.add(thread)
        thread.start()

    def stop_calibration(self, timeout_s: float = 5.0) -> None:
        """End a background calibration between two chunks (its server stops): nothing is
        kept, the next server of this version calibrates again."""
        self._stop.set()
        thread = self._calibration
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _calibrate(self) -> None:
        t0 = time.thread_time()
        try:
            if self._restore():
                self.thresholds_from = "file"
                return
            _calibrate_all(list(self.references.values()), self.window.capacity, self._stop)
            self.thresholds_from = "computed"
            if self._file is not None and self.references:
                self._file.save({ref.name: ref.calibration()
                                 for ref in self.references.values()})
        except CalibrationStopped:
            return  # left unfinished on purpose: never calibrated, never kept
        finally:
            self.calibration_s = time.thread_time() - t0
            if self.thresholds_from is not None:
                self._calibrated.set()
            _CALIBRATIONS.discard(threading.current_thread())

    def _restore(self) -> bool:
        """The thresholds kept beside the version, when they were computed for this profile."""
        if self._file is None or not self.references:
            return False
        kept = self._file.load()
        if kept is None or any(ref.name not in kept for ref in self.references.values()):
            return False
        try:
            for ref in self.references.values():
                ref.restore(kept[ref.name])
        except (TypeError, ValueError, AttributeError):
            return False
        return True

    @property
    def calibrated(self) -> bool:
        return self._calibrated.is_set()

    def wait_calibrated(self, timeout_s: float | None = None) -> bool:
        """Block until the calibration is done (starting it here if nobody did)."""
        if not self._calibrated.is_set() and self._calibration is None:
            self.calibrate(background=False)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._calibrated.wait(
                0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))):
            if self._stop.is_set() or _EXITING.is_set():
                return False  # stopped: it will never be done
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def add(self, inputs: np.ndarray | None, scores: np.ndarray | None) -> None:
        with self._lock:
            if inputs is not None:
                if inputs.ndim == 2 and inputs.shape[1] == len(self.names):
                    self.window.add(inputs.astype(np.float64, copy=False))
                else:
                    self.skipped += int(inputs.shape[0]) if inputs.ndim else 1
            if scores is not None and scores.size:
                col = scores.reshape(-1, 1).astype(np.float64, copy=False)
                self.predictions.add(col)
                if self.prediction_ref is None:
                    self._baseline.append(col[:, 0])
                    self._baseline_rows += col.shape[0]
                    if self._baseline_rows >= min(self._baseline_target, 1000):
                        self._freeze_prediction_baseline()

    def _freeze_prediction_baseline(self) -> None:
        """No training profile of predictions exists: the first live ones are the baseline."""
        from redline.models.metadata import profile_inputs

        base = np.concatenate(self._baseline)
        prof = profile_inputs(base.reshape(-1, 1), ["prediction"])
        feat = prof.get("features", {}).get("prediction")
        if feat and "histogram" in feat:
            self.prediction_ref = FeatureReference.from_profile(
                "prediction", feat, prof["quantile_levels"], int(prof.get("rows", 0)))
        self._baseline = []
        self.predictions = RollingWindow(1, self.predictions.capacity)

    def report(self) -> dict[str, Any]:
        """Per feature (and the prediction): statistics, thresholds, rates and the verdict.

        Waits for the calibration (call it from a worker thread, never the event loop)."""
        self.wait_calibrated()
        with self._lock:
            rows = self.window.rows().copy()
            preds = self.predictions.rows()[:, 0].copy()
            started, seen = self.window.started, self.window.seen
        features = []
        for i, ref in sorted(self.references.items()):
            yield_to_loop()  # on the tick's thread: the loop first (~0.5 ms a feature)
            features.append(self._feature(i, ref, rows[:, i]))
        prediction = None
        if self.prediction_ref is not None:
            yield_to_loop()
            prediction = self._one(self.prediction_ref, preds, reference="first live window")
            if not self._prediction_calibrated and prediction["thresholds"]:
                # The baseline's thresholds for every other window size too, now, once (after
                # the class this report needed, so its numbers are those it always had):
                # computed as the window fills, each new size class would be ~1 ms of
                # thresholds in one piece in a later report on the tick. Here in hand-over-sized
                # chunks.
                _calibrate_all([self.prediction_ref], self.predictions.capacity)
                self._prediction_calibrated = True
        drifted = [f["feature"] for f in features if f["drift"]]
        if prediction is not None and prediction["drift"]:
            drifted.append(prediction["feature"])  # "prediction": the model's own output
        report = {
            "model": self.model, "version": self.version,
            "window": {"rows": int(rows.shape[0]), "capacity": self.window.capacity,
                       "seen": int(seen), "since": round(started, 3),
                       "min_rows": self.min_rows, "skipped_rows": self.skipped},
            "reference": "training profile" if self.references else None,
            "features": features, "prediction": prediction,
            "drifted": drifted, "drift": bool(drifted),
        }
        self.last_report = report
        return report

    def _feature(self, i: int, ref: FeatureReference, col: np.ndarray) -> dict[str, Any]:
        return self._one(ref, col)

    def _one(self, ref: FeatureReference, col: np.ndarray,
             reference: str = "training profile") -> dict[str, Any]:
        n_all = col.size
        finite = col[np.isfinite(col)]
        n = finite.size
        out: dict[str, Any] = {"feature": ref.name, "kind": ref.kind, "rows": int(n_all)}
        missing = 1.0 - n / n_all if n_all else 0.0
        out["missing_rate"] = round(missing, 4)
        out["reference_missing_rate"] = round(ref.missing_share, 4)
        out_of_range = float(np.mean((finite < ref.lo) | (finite > ref.hi))) if n else 0.0
        out["out_of_range_rate"] = round(out_of_range, 4)
        if n < self.min_rows:
            out.update(statistics={}, thresholds={}, drift=False,
                       reason=f"window has {n} rows, fewer than min_rows {self.min_rows}")
            return out
        stats = ref.statistics(finite)
        limits = ref.thresholds(n)
        beyond = [k for k, v in stats.items() if v > limits[k]]
        if missing > _rate_threshold(ref.missing_share, n_all):
            beyond.append("missing_rate")
        if out_of_range > _rate_threshold(0.0, n):
            beyond.append("out_of_range_rate")
        out["statistics"] = {k: round(v, 5) for k, v in stats.items()}
        out["thresholds"] = {k: round(v, 5) for k, v in limits.items()}
        if ref.kind == "categorical":
            live = ref.shares(finite)
            keys = [_fmt(c) for c in ref.categories] + ["unseen"]
            out["shares"] = {k: round(float(v), 4) for k, v in zip(keys, live, strict=True)}
            out["reference_shares"] = {k: round(float(v), 4)
                                       for k, v in zip(keys, ref.ref_p, strict=True)}
        out["drift"] = bool(beyond)
        out["beyond"] = beyond
        if reference != "training profile":
            out["reference"] = reference
        return out

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The training min and max per input column (infinite where not profiled)."""
        if self._bounds is None:
            lo = np.full(len(self.names), -np.inf)
            hi = np.full(len(self.names), np.inf)
            for i, ref in self.references.items():
                lo[i], hi[i] = ref.lo, ref.hi
            self._bounds = (lo, hi)
        return self._bounds

    def out_of_range(self, row: np.ndarray) -> list[str]:
        """Names of the features of one row outside the training range (for review)."""
        bad = []
        for i, ref in self.references.items():
            v = row[i]
            if math.isfinite(v) and (v < ref.lo or v > ref.hi):
                bad.append(ref.name)
        return bad


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
