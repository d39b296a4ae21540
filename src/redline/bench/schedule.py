"""When requests are due: constant spacing or Poisson arrivals, fixed before the run starts.

An open-loop generator sends on this schedule whatever the server does, and measures latency
from each request's scheduled time, so a stalled server cannot hide its stall by slowing the
client down (coordinated omission).
"""

from __future__ import annotations

import numpy as np


def send_times(rate: float, duration_s: float, kind: str = "constant", seed: int = 0) -> np.ndarray:
    """Offsets in seconds from the start of the run, ascending, all below ``duration_s``."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    count = int(rate * duration_s)
    if kind == "constant":
        return np.arange(count, dtype=np.float64) / rate
    if kind == "poisson":
        rng = np.random.default_rng(seed)
        gaps = rng.exponential(1.0 / rate, size=int(count * 1.2) + 16)
        times = np.cumsum(gaps) - gaps[0]
        return times[times < duration_s]
    raise ValueError(f"unknown schedule {kind!r}: use 'constant' or 'poisson'")
