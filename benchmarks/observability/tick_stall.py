"""How long monitoring's tick keeps the event loop from running: hand-over vs plain thread.

Builds a ``ServerMonitor`` for one model version with ``--features`` profiled inputs (the /v1
workload has 40), feeds it ``--rate`` records per tick, and runs ``--ticks`` ticks (every
``DRIFT_EVERY_TICKS``-th evaluates drift and quality), alternating per round between the tick's
worker thread handing the GIL to the loop between units (``handoff.py``, the default) and a
plain ``asyncio.to_thread`` (as before). Reported per mode: the loop's longest lag behind a
``--sample-us`` sleep (what a request arriving meanwhile waits, under the default scheduler)
and the worker's longest unit of CPU between two hand-overs (what the loop waits under
``SCHED_FIFO``, where it cannot preempt the worker; for the plain thread: the whole work).
Prints one JSON document. Run it under the project's CPU lock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import types
from typing import Any

import numpy as np

from redline.config import Settings
from redline.models.metadata import profile_inputs
from redline.monitoring import handoff
from redline.monitoring import monitor as monitor_module
from redline.monitoring.monitor import VersionFolders
from redline.serving.stages import RequestRecord


class _EmptyQueue:
    """A version's queue that nothing is sent to (``serving_gauges.QueueDepth``)."""

    queued = 0
    cap = 0


class _NoCounts:
    """A version's admission counts, none yet (``serving_gauges.AdmissionCounts``)."""

    def as_dict(self) -> dict[str, int]:
        return {}


class _Handle:
    """The one loaded version a monitor needs (its metadata); nothing is served
    (``monitor.MonitoredVersion``)."""

    version_str = "1"

    def __init__(self, meta: Any) -> None:
        self.metadata = meta
        self.batcher = _EmptyQueue()
        self.stats = _NoCounts()


class OneModelRegistry:
    """A registry of one model 'm', version 1, with ``meta`` as its metadata (shared with
    tests/monitoring/test_handoff.py); no repository, so drift thresholds are not kept
    (``monitor.MonitoredModels``)."""

    repository: VersionFolders | None = None

    def __init__(self, meta: Any) -> None:
        self.handle = _Handle(meta)

    def models(self) -> list[str]:
        return ["m"]

    def loaded(self, name: str) -> list[_Handle]:
        return [self.handle]

    def get(self, name: str, version: str | None = None) -> _Handle:
        return self.handle


def _record(i: int, x: np.ndarray) -> RequestRecord:
    r = RequestRecord("v1", "rest", 1_000_000_000)
    r.model, r.version, r.path, r.request_id, r.rows = "m", "1", "primary", f"r{i}", 1
    r.inputs, r.outputs = {"x": x}, {"probabilities": np.array([[0.4, 0.6]], np.float32)}
    r.add("queue", 1_000_000_000, 1_000_010_000)
    r.finish("ok", 1_000_020_000)
    return r


def run_mode(yielding: bool, args: argparse.Namespace, meta: Any) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    monitor = monitor_module.ServerMonitor(Settings(), OneModelRegistry(meta))
    monitor.prepare_loaded(wait=True)
    units: list[tuple[float, str]] = []
    last = [0.0]
    plain = asyncio.to_thread

    async def plain_timed(func: Any, *a: Any) -> Any:
        def work() -> Any:
            t = time.thread_time()
            try:
                return func(*a)
            finally:
                units.append((time.thread_time() - t, "whole"))
        return await plain(work)

    original = handoff.LoopHandoff.__call__

    def timed_call(self: handoff.LoopHandoff) -> None:
        caller = sys._getframe(2).f_code  # the unit that ended: where yield_to_loop was called
        units.append((time.thread_time() - last[0], caller.co_name))
        original(self)
        last[0] = time.thread_time()

    async def yielding_timed(func: Any, *a: Any) -> Any:
        def work() -> Any:
            last[0] = time.thread_time()
            try:
                return func(*a)
            finally:
                units.append((time.thread_time() - last[0], "last"))
        return await handoff.to_thread_yielding(work)

    handoff.LoopHandoff.__call__ = timed_call  # type: ignore[method-assign]
    monitor_module.to_thread_yielding = yielding_timed if yielding else plain_timed  # type: ignore[assignment]
    lags: list[float] = []
    sample_s = args.sample_us / 1e6

    async def main() -> None:
        stop = False

        async def sampler() -> None:
            while not stop:
                t = time.perf_counter()
                await asyncio.sleep(sample_s)
                lags.append(time.perf_counter() - t - sample_s)

        task = asyncio.create_task(sampler())
        for i in range(args.ticks):
            xs = rng.normal(0, 1, (args.rate, 1, args.features)).astype(np.float32)
            for j in range(args.rate):
                monitor.feed.request_finished(_record(i * args.rate + j, xs[j]))
            await asyncio.sleep(0.01)
            del lags[:]  # only the tick's own lags, below, for this tick
            await monitor.tick()
            tick_lags.append(max(lags) if lags else 0.0)
        stop = True
        await task

    tick_lags: list[float] = []
    try:
        asyncio.run(main())
    finally:
        handoff.LoopHandoff.__call__ = original  # type: ignore[method-assign]
        monitor_module.to_thread_yielding = handoff.to_thread_yielding
    return {"tick_max_lag_us": [round(v * 1e6) for v in tick_lags],
            "max_lag_us": round(max(tick_lags) * 1e6),
            "median_tick_max_lag_us": round(float(np.median(tick_lags)) * 1e6),
            "longest_units_cpu_us": [(round(u * 1e6), name) for u, name in sorted(units)[-4:]],
            "units": len(units)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", type=int, default=40)
    ap.add_argument("--rate", type=int, default=500, help="records per tick")
    ap.add_argument("--ticks", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sample-us", type=float, default=200.0)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    names = [f"f{i}" for i in range(args.features)]
    meta = types.SimpleNamespace(
        input_profile=profile_inputs(rng.normal(0, 1, (20_000, args.features)), names),
        feature_names=names, task="classification", metrics={"roc_auc": 0.7})
    out: dict[str, list[dict[str, Any]]] = {"handoff": [], "thread": []}
    for _ in range(args.rounds):
        for mode in ("handoff", "thread"):
            out[mode].append(run_mode(mode == "handoff", args, meta))
    print(json.dumps({"args": vars(args), **out}, indent=1))


if __name__ == "__main__":
    main()
