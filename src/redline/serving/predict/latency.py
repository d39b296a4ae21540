"""A model's recent p99 run time, the estimate the budget-aware fallback steers by.

Why it ages by time and probes: an estimate that is updated only when the primary runs can latch.
A burst of large batches once pushed a model's p99 past its SLO; from then on every request took
the cheaper path, the model never ran again, and the p99 never fell (74 of 74 requests on the
default answer over 15 s on an idle server). Here samples older than ``window_s`` are forgotten,
so the estimate falls back to "unknown" (run the primary) by itself, and while it says the model
cannot fit and the primary has not run for ``probe_interval_s``, the next request runs the
primary anyway, so a recovered model is noticed within a probe or two. At most
``1 / probe_interval_s`` requests a second are probes, and none while the primary runs anyway.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from redline.serving.deadline import now


class LatencyWindow:
    """p99 over the last ``size`` runs that are younger than ``window_s``; see the module doc."""

    __slots__ = ("_ended", "_seconds", "p99", "window_s", "probe_interval_s", "probes",
                 "_since", "_last_probe", "_clock")

    def __init__(self, size: int, window_s: float = 10.0, probe_interval_s: float = 0.1,
                 clock: Callable[[], float] = now) -> None:
        # When each run ended, and how long it took: two deques, so the p99 reads the run times
        # into numpy in C (a tuple deque walked in Python made each recompute ~45 µs, ~3 µs a
        # /v1 request at one recompute per 16 runs).
        self._ended: deque[float] = deque(maxlen=max(16, size))
        self._seconds: deque[float] = deque(maxlen=max(16, size))
        self.p99 = 0.0
        self.window_s = window_s
        self.probe_interval_s = probe_interval_s
        self.probes = 0  # requests that ran the primary against the estimate
        self._since = 0
        self._last_probe = -1e18
        self._clock = clock

    def add(self, seconds: float) -> None:
        # The p99 is recomputed when read (``estimate``), not here: most windows are read far
        # less often than they are added to (a graph step without a fallback never is).
        t = self._clock()
        self._ended.append(t)
        self._seconds.append(seconds)
        self._last_probe = t  # a run just measured the model: no probe is due
        self._since += 1

    def estimate(self) -> float:
        """The current p99 in seconds (0 when there is no recent run): old samples drop out;
        recomputed once 16 runs came since the last time (each run while there are fewer)."""
        ended = self._ended
        since = self._since
        if (since >= 16 or (since and len(ended) < 16)
                or (ended and ended[0] < self._clock() - self.window_s)):
            self._recompute()
        return self.p99

    def probe(self) -> bool:
        """Whether this request should run the primary although the estimate says it won't fit:
        true when the primary has not run (nor been probed) for ``probe_interval_s``."""
        t = self._clock()
        if t - self._last_probe < self.probe_interval_s:
            return False
        self._last_probe = t
        self.probes += 1
        return True

    def _recompute(self) -> None:
        self._since = 0
        ended, seconds = self._ended, self._seconds
        horizon = self._clock() - self.window_s
        while ended and ended[0] < horizon:
            ended.popleft()
            seconds.popleft()
        self.p99 = _p99(seconds)


def _p99(seconds: deque[float]) -> float:
    """``np.percentile(seconds, 99)`` (linear interpolation) by one partial sort: the same
    value at a fifth of the cost (numpy's percentile machinery is ~30 µs of Python)."""
    n = len(seconds)
    if not n:
        return 0.0
    values = np.fromiter(seconds, float, n)
    k = 0.99 * (n - 1)
    lo = int(k)
    hi = min(lo + 1, n - 1)
    values.partition((lo, hi))
    return float(values[lo] + (values[hi] - values[lo]) * (k - lo))
