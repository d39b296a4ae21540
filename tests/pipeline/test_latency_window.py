"""The fallback's p99 estimate: numpy's percentile, over the runs of the last window only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redline.serving.predict.latency import LatencyWindow


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), min_size=1,
                max_size=700))
def test_estimate_is_numpys_p99_of_the_last_runs(seconds: list[float]) -> None:
    clock = [0.0]
    window = LatencyWindow(512, window_s=10.0, clock=lambda: clock[0])
    for s in seconds:
        window.add(s)
    window._recompute()  # estimate() recomputes once 16 runs came; compare the exact value
    # numpy interpolates with another formula: equal to the last bit or two
    assert window.estimate() == pytest.approx(np.percentile(seconds[-512:], 99), rel=1e-12)


def test_runs_older_than_the_window_drop_out() -> None:
    clock = [0.0]
    window = LatencyWindow(512, window_s=10.0, clock=lambda: clock[0])
    for _ in range(100):
        window.add(1.0)      # a burst of slow runs...
    clock[0] = 5.0
    for _ in range(100):
        window.add(0.001)    # ...then fast ones
    assert window.estimate() == 1.0
    clock[0] = 10.5          # the burst is older than 10 s; the fast runs are not
    assert window.estimate() == 0.001
    clock[0] = 16.0          # nothing recent: unknown (run the primary)
    assert window.estimate() == 0.0
