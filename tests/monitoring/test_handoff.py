"""The tick's worker thread hands the GIL to the event loop between small units of work."""

from __future__ import annotations

import asyncio
import threading
import time
import types
from typing import Any

import numpy as np
import pytest

from benchmarks.observability.tick_stall import OneModelRegistry
from redline.config import Settings
from redline.models.metadata import profile_inputs
from redline.monitoring import drift as drift_module
from redline.monitoring import monitor as monitor_module
from redline.monitoring.handoff import to_thread_yielding, yield_to_loop
from tests.monitoring.helpers import record

FEATURES = 24


class Turns:
    """A coroutine that counts the loop's turns while the thread works."""

    def __init__(self) -> None:
        self.count = 0
        self.stop = False

    async def spin(self) -> None:
        while not self.stop:
            self.count += 1
            await asyncio.sleep(0)


def test_outside_the_tick_nothing_is_handed_over() -> None:
    assert yield_to_loop() is False
    out: list[bool] = []
    thread = threading.Thread(target=lambda: out.append(yield_to_loop()))
    thread.start()
    thread.join()
    assert out == [False]


def test_the_loop_runs_between_every_two_units() -> None:
    turns = Turns()
    seen: list[tuple[int, int]] = []

    def work() -> int:
        for _ in range(20):
            start = turns.count
            t = time.perf_counter()
            while time.perf_counter() - t < 0.002:  # 2 ms of Python holding the GIL
                pass
            seen.append((start, turns.count))
            yield_to_loop()
        return 7

    async def main() -> int:
        spinner = asyncio.create_task(turns.spin())
        try:
            return await to_thread_yielding(work)
        finally:
            turns.stop = True
            await spinner

    assert asyncio.run(main()) == 7
    # every unit began after the loop had another turn than the one the last unit ended in
    assert all(seen[i + 1][0] > seen[i][1] for i in range(len(seen) - 1))


@pytest.mark.slow
def test_a_tick_hands_the_loop_a_turn_between_features_and_record_slices(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    names = [f"f{i}" for i in range(FEATURES)]
    meta = types.SimpleNamespace(
        input_profile=profile_inputs(rng.normal(0, 1, (5000, FEATURES)), names),
        feature_names=names, task="classification", metrics={"roc_auc": 0.7})
    settings = Settings()
    settings.monitoring.drift_window_rows = 2000
    settings.monitoring.drift_min_rows = 100
    settings.monitoring.window_rows_per_s = 0  # every record reaches the windows
    monitor = monitor_module.ServerMonitor(settings, OneModelRegistry(meta))
    monitor.prepare_loaded(wait=True)
    for i in range(1000):
        monitor.feed.request_finished(record(
            api="v1", inputs={"x": rng.normal(0, 1, (1, FEATURES)).astype(np.float32)},
            outputs={"probabilities": np.array([[0.4, 0.6]], np.float32)},
            request_id=f"r{i}"))

    turns = Turns()
    units: list[tuple[str, int, int]] = []

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = turns.count
            try:
                return fn(*args, **kwargs)
            finally:
                units.append((name, start, turns.count))
        return wrapper

    monkeypatch.setattr(drift_module.DriftMonitor, "_one",  # a feature's (or the prediction's)
                        counted("feature", drift_module.DriftMonitor._one))
    windows_cls = type(monitor.windows)
    monkeypatch.setattr(windows_cls, "_absorb_version",
                        counted("absorb", windows_cls._absorb_version))
    monitor._ticks = monitor_module.DRIFT_EVERY_TICKS - 1  # this tick evaluates

    async def main() -> None:
        spinner = asyncio.create_task(turns.spin())
        try:
            await monitor.tick()
        finally:
            turns.stop = True
            await spinner

    asyncio.run(main())
    kinds = [u[0] for u in units]
    assert kinds.count("absorb") >= 1000 // 128  # the second's records, in slices
    drift = monitor.windows.drift[("m", "1")]
    assert kinds.count("feature") == FEATURES + (drift.prediction_ref is not None)
    for before, after in zip(units, units[1:], strict=False):
        assert after[1] > before[2], (before, after)  # the loop ran in between
    report = monitor.drift_reports[("m", "1")]
    assert [f["feature"] for f in report["features"]] == names
    assert report["window"]["rows"] == 1000
