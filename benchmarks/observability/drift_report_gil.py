"""What a drift report costs a thread busy with Python beside it: this code against a commit's.

A report runs on the tick's worker thread while the event loop serves. numpy lets the GIL go in
each call over thousands of values, and a busy loop takes it back every time, so a report's cost
to the requests is how often the two threads hand the GIL over, not its own CPU. Here the main
thread spins Python (a stand-in for a loop at capacity) while a second thread makes reports of
``--features`` features over a full ``--window``-row window, for ``--seconds`` a turn; turns
alternate between this checkout's ``DriftMonitor`` and, with ``--against REV``, the one at commit
``REV`` (its ``monitor.py`` from git, run in this process with this checkout's other modules),
and an idle turn (no reports) gives the spinner's own rate. Reported per turn: the wall time of
one report, the process's context switches per report, the spinner's rate against idle, and a
report's CPU alone. Run it under the project's CPU lock.

    PYTHONPATH=src:. python benchmarks/observability/drift_report_gil.py --against 3184acd^
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from redline.models.metadata import profile_inputs
from redline.monitoring.drift import DriftMonitor

ROOT = Path(__file__).resolve().parents[2]
MONITOR = "src/redline/monitoring/drift/monitor.py"


def monitor_at(rev: str) -> type:
    """``DriftMonitor`` as commit ``rev`` wrote it (its module only, from git)."""
    source = subprocess.run(["git", "show", f"{rev}:{MONITOR}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "monitor_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("redline.monitoring.drift.monitor_at_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DriftMonitor  # type: ignore[no-any-return]


def window(rng: np.random.Generator, rows: int, features: int) -> np.ndarray:
    """Numeric features, every third categorical (4 levels)."""
    return np.column_stack([rng.choice(4, rows).astype(float) if i % 3 == 0
                            else rng.lognormal(3, 1, rows) for i in range(features)])


def ready(cls: type, features: int, rows: int) -> Any:
    rng = np.random.default_rng(0)
    names = [f"f{i}" for i in range(features)]
    monitor = cls("m", "1", profile_inputs(window(rng, 20_000, features), names), names,
                  window_rows=rows, min_rows=100)
    monitor.add(None, rng.random(rows))  # the prediction's baseline
    monitor.add(window(rng, rows, features), rng.random(rows))
    monitor.calibrate(background=False)
    monitor.report()
    return monitor


def turn(monitor: Any | None, seconds: float) -> dict[str, float]:
    """Spin on this thread for ``seconds`` while another makes reports (None: idles)."""
    stop = threading.Event()
    reports = [0]

    def work() -> None:
        while not stop.is_set():
            if monitor is None:
                time.sleep(0.01)
            else:
                monitor.report()
                reports[0] += 1

    thread = threading.Thread(target=work)
    thread.start()
    before = resource.getrusage(resource.RUSAGE_SELF)
    spins, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            spins += 1
    after = resource.getrusage(resource.RUSAGE_SELF)
    stop.set()
    thread.join()
    n = max(reports[0], 1)
    switches = (after.ru_nvcsw - before.ru_nvcsw) + (after.ru_nivcsw - before.ru_nivcsw)
    return {"spins_per_s": spins / seconds, "reports": reports[0],
            "wall_ms_per_report": seconds * 1000 / n, "switches_per_report": switches / n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="a commit whose DriftMonitor runs in the other turns")
    parser.add_argument("--features", type=int, default=12)
    parser.add_argument("--window", type=int, default=5000, help="rows in the window")
    parser.add_argument("--seconds", type=float, default=2.0, help="a turn's length")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    monitors = {"this": ready(DriftMonitor, args.features, args.window)}
    if args.against:
        monitors[args.against] = ready(monitor_at(args.against), args.features, args.window)
    print(f"{args.features} features, {args.window:,} rows, {args.seconds:g} s turns")
    for r in range(1, args.rounds + 1):
        idle = turn(None, args.seconds)["spins_per_s"]
        for name, monitor in monitors.items():
            got = turn(monitor, args.seconds)
            print(f"round {r} {name:>10}: {got['wall_ms_per_report']:6.1f} ms a report, "
                  f"{got['switches_per_report']:6.1f} switches a report, spinner "
                  f"{got['spins_per_s'] / idle:5.3f}x idle ({got['reports']} reports)")
    for name, monitor in monitors.items():
        t = time.process_time()
        for _ in range(20):
            monitor.report()
        print(f"{name:>10}: {(time.process_time() - t) / 20 * 1000:.2f} ms of CPU a report alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
