"""How long a killed worker of ``redline serve --workers 2`` is out: SIGKILL to its replacement's
first answer, with monitoring on (a model with a training profile, so drift thresholds exist)
and a steady load on the pool meanwhile.

The supervisor notices the death within its 20 ms poll and starts the replacement; the time
that counts is until the replacement itself answers a readiness probe and a request (checked by
its pid in ``/v1/monitoring/summary``, on fresh connections, so the other worker cannot answer
for it).

    PYTHONPATH=src:. .venv/bin/python benchmarks/scaling/worker_restart.py --kills 6
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from tests.scaling.procs import Serve, SteadyLoad
from tests.scaling.test_workers import profiled_repo, served_by, slot_pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=6, help="workers killed, slots in turn")
    parser.add_argument("--threads", type=int, default=3, help="closed-loop callers of the load")
    parser.add_argument("--pause-ms", type=float, default=8.0,
                        help="each caller's pause between requests (3 x 8 ms: ~250 req/s)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="redline-restart-"))
    body = profiled_repo(root, width=16)
    serve = Serve(root, "--workers", "2").wait_ready()
    out: list[float] = []
    try:
        serve.wait_children(2)
        with SteadyLoad(serve.url, threads=args.threads, seconds=60 + 10 * args.kills, retries=1,
                        body=body, pause_s=args.pause_ms / 1000) as load:
            time.sleep(2)
            began = time.monotonic()
            for i in range(args.kills):
                slot = i % 2
                victim = slot_pid(serve, slot)
                killed = time.monotonic()
                os.kill(victim, signal.SIGKILL)
                while slot_pid(serve, slot) == victim:
                    time.sleep(0.005)
                replacement = slot_pid(serve, slot)
                if not served_by(serve.url, replacement, time.monotonic() + 60):
                    raise SystemExit(f"worker {slot} (pid {replacement}) never served")
                out.append(time.monotonic() - killed)
                print(f"kill {i + 1}: worker {slot} back in {out[-1]:.2f} s", flush=True)
                time.sleep(2)
            seconds = time.monotonic() - began
            result = load.stop()
    finally:
        serve.stop()
    print(f"SIGKILL to first answer: min {min(out):.2f} s, median {statistics.median(out):.2f} s, "
          f"max {max(out):.2f} s over {len(out)} kills; load {result.ok} answered "
          f"(~{result.ok / (seconds + 2):.0f} req/s), {result.failed} failed after one resend; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
