"""Drift thresholds computed from the reference itself: how large each statistic gets by chance.

A threshold is an *effect size*: the larger of a floor (a shift small enough to ignore) and a
high percentile of the statistic over windows of the same size drawn from the reference profile
(the statistic's own noise at that size). Window sizes come in classes of 1.5x steps from 100
rows, so each class is computed once per feature and kept beside the version
(``FeatureReference.calibration``).

The work is numpy in chunks of a millisecond or so with the GIL offered back between them,
because it runs beside a serving event loop; it ends between two chunks
(:class:`CalibrationStopped`) when its server stops or the interpreter exits.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.monitoring.drift.stats import QUANTILE_GRID, js_rows, psi_rows
from redline.monitoring.handoff import yield_to_loop

if TYPE_CHECKING:
    from redline.monitoring.drift.reference import FeatureReference

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
# What a calibration's result depends on besides the profile (part of a kept file's fingerprint).
CALIBRATION_CONSTANTS = {"psi_floor": PSI_FLOOR, "js_floor": JS_FLOOR,
                         "wasserstein_floor": WASSERSTEIN_FLOOR, "null_quantile": NULL_QUANTILE,
                         "null_draws": NULL_DRAWS, "w_draws": W_DRAWS, "w_quantile": W_QUANTILE}


class CalibrationStopped(Exception):
    """A calibration left unfinished: its server stopped, or the interpreter is exiting."""


# Set when the interpreter exits: a background calibration ends between two chunks instead of
# being cut inside numpy's C++ code, where killing a daemon thread aborts the process.
EXITING = threading.Event()
RUNNING: set[threading.Thread] = set()  # background calibrations, joined at exit


def _stop_calibrations_at_exit() -> None:
    EXITING.set()
    for thread in list(RUNNING):
        thread.join(5.0)


atexit.register(_stop_calibrations_at_exit)


def offer_gil(stop: threading.Event | None = None) -> None:
    """Offer the GIL to other threads (the event loop) between two chunks of numpy work: on
    the tick's thread (a prediction baseline's first thresholds, in a report) a hand-over
    that waits for the loop; elsewhere (the background calibration) ``sleep(0)``. Raises
    :class:`CalibrationStopped` once the interpreter exits or ``stop`` is set."""
    if EXITING.is_set() or (stop is not None and stop.is_set()):
        raise CalibrationStopped
    if not yield_to_loop():
        time.sleep(0)


def size_classes(capacity: int) -> list[int]:
    """Every window size class a window of ``capacity`` rows goes through while it fills.

    >>> size_classes(1000)
    [100, 150, 225, 337, 505, 757]
    """
    sizes = [100]
    while sizes[-1] * 1.5 <= capacity:
        sizes.append(int(sizes[-1] * 1.5))
    return sizes


def size_class(n: int) -> int:
    """Window sizes rounded down to 1.5x steps, so calibrations are reused as a window fills.

    >>> size_class(99), size_class(224), size_class(225)
    (100, 150, 225)
    """
    size = 100
    while size * 1.5 <= n:
        size = int(size * 1.5)
    return size


def calibrate_all(refs: list[FeatureReference], capacity: int,
                  stop: threading.Event | None = None) -> None:
    """Every size class's thresholds of ``refs``, a class and feature at a time (until
    ``stop`` is set: then :class:`CalibrationStopped`)."""
    for size in size_classes(capacity):
        for ref in refs:
            # by class, not ``thresholds(size)``: a class is int(1.5 x the last), so
            # ``size_class(size)`` is often the class below it, and the classes left out were
            # computed in the first report that needed them (~4 ms a feature)
            ref.class_thresholds(size)
            offer_gil(stop)


def share_thresholds(rng: np.random.Generator, q: np.ndarray, size: int,
                     ref_rows: int) -> dict[str, float]:
    """PSI and JS thresholds for windows of ``size`` rows over reference shares ``q``: exact,
    by multinomial draws of the bin shares."""
    p = multinomials(rng, size, q) / size
    # The profile is itself a sample: compare with a redrawn reference of the same size, so
    # a small training sample's own noise is not taken for drift.
    r = multinomials(rng, ref_rows, q) / ref_rows if ref_rows else np.broadcast_to(q, p.shape)
    return {"psi": max(PSI_FLOOR, float(np.percentile(psi_rows(p, r), NULL_QUANTILE))),
            "js": max(JS_FLOOR, float(np.percentile(js_rows(p, r), NULL_QUANTILE)))}


def wasserstein_noise(rng: np.random.Generator, ref: FeatureReference) -> float:
    """The ``W_QUANTILE`` percentile of the Wasserstein distance of 1,000-value windows drawn
    from ``ref`` (in chunks, each a millisecond or two of numpy, the GIL offered between)."""
    ref_q = ref.reference_quantiles()
    method: Any = "inverted_cdf" if ref.integer else "linear"
    parts = []
    for _ in range(W_DRAWS // W_CHUNK):
        draws = ref.sample(rng, W_CHUNK * 1000).reshape(W_CHUNK, 1000)
        live = np.quantile(draws, QUANTILE_GRID, axis=1, method=method).T
        parts.append(np.mean(np.abs(live - ref_q), axis=1) / ref.scale)
        offer_gil()
    return float(np.percentile(np.concatenate(parts), W_QUANTILE))


def wasserstein_threshold(w1000: float, size: int, ref_rows: int) -> float:
    """The threshold for ``size`` rows from the noise at 1,000 (``wasserstein_noise``): the
    noise shrinks as sqrt(1/n + 1/n_reference), since both sides are samples."""
    inv = 1 / size + (1 / ref_rows if ref_rows else 0.0)
    return max(WASSERSTEIN_FLOOR, w1000 * math.sqrt(1000 * inv))


def multinomials(rng: np.random.Generator, n: int, q: np.ndarray) -> np.ndarray:
    """``NULL_DRAWS`` multinomial draws of ``n`` over ``q``, in chunks with the GIL offered
    back between them (2,000 draws in one call were 2-5 ms in one piece). The draws are one
    random stream whatever the chunk: the same numbers as one call."""
    parts = []
    for start in range(0, NULL_DRAWS, NULL_CHUNK):
        if start:
            offer_gil()
        parts.append(rng.multinomial(n, q, size=min(NULL_CHUNK, NULL_DRAWS - start)))
    return np.concatenate(parts)


def rate_threshold(base: float, n: int) -> float:
    """The missing or out-of-range rate above which ``n`` rows drifted from a ``base`` rate.

    >>> rate_threshold(0.0, 1000)
    0.05
    """
    return base + max(RATE_FLOOR, 4.0 * math.sqrt(max(base * (1 - base), 1e-4) / max(n, 1)))
