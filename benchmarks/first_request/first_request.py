"""The first request after ready against the ones after it (server time, ``timings_us``).

Starts ``redline serve --config .redline/demo/redline.yaml`` (run ``make demo`` first), waits for
readiness, then sends ``--requests`` ``/v1/models/fraud/predict`` requests one at a time and
records the server's own stage timings for each; repeated ``--runs`` times with a fresh server,
alternating the server's request-path warm-up (serving/warmup.py) off and on. The ratio first /
median-of-the-rest is the number that matters (the machine's noise hits both).

``--gap-ms`` waits that long before every request, the first included (it is sent that long
after readiness was seen), so the first and the later requests meet the same conditions: a
request that follows a quiet spell of ~100 ms costs several times one sent back to back on this
machine (caches and the CPU go cold while the process waits), whether it is the first or the
thousandth. ``--gap-ms 0`` sends the later requests back to back.
``--before SRC`` adds a third server per run, warm-up on, from another source tree (an older
commit's ``src``): before/after in the same run.

    python benchmarks/first_request/first_request.py --runs 4
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# "off": the server without serving/warmup.py's preparation (for the comparison only)
SERVE = ("import sys\n"
         "if sys.argv[1] == 'off':\n"
         "    import redline.serving.server as s\n"
         "    async def off(*a): return 0\n"
         "    s.warm_request_path = off\n"
         "from redline.cli import main\n"
         "main(sys.argv[2:])")


def one_run(config: str, body: bytes, requests: int, warmup: str, gap_s: float,
            src: str | None = None) -> list[dict[str, int]]:
    port = free_port()
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "on" if src else warmup, "serve",
                             "--config", config, "--http-port", str(port), "--no-grpc",
                             "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        totals: list[dict[str, int]] = []
        with httpx.Client(base_url=url, timeout=10) as client:
            client.get("/v2/health/live")  # the connection, made before the gap
            for _ in range(requests):
                time.sleep(gap_s)
                r = client.post("/v1/models/fraud/predict", content=body)
                r.raise_for_status()
                totals.append(r.json()["timings_us"])
        return totals
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=".redline/demo/redline.yaml")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--gap-ms", type=float, default=200.0,
                        help="pause before every request, the first included (0: none)")
    parser.add_argument("--before", default=None, metavar="SRC",
                        help="also serve from this source tree (warm-up on), in each run")
    args = parser.parse_args()
    body = Path(args.config).with_name("fraud-request.json").read_bytes()
    runs: dict[str, list[list[dict[str, int]]]] = {"off": [], "on": []}
    if args.before:
        runs["before"] = []
    for _ in range(args.runs):
        for warmup in runs:
            src = args.before if warmup == "before" else None
            runs[warmup].append(one_run(args.config, body, args.requests, warmup,
                                        args.gap_ms / 1000.0, src))
    for warmup, done in runs.items():
        print(f"request-path warm-up {warmup}:")
        for k in sorted({k for run in done for t in run for k in t}):
            first = [run[0].get(k, 0) for run in done]
            later = [statistics.median(t.get(k, 0) for t in run[1:]) for run in done]
            print(f"  {k:<10} first {statistics.median(first):7.0f} us   later median "
                  f"{statistics.median(later):7.0f} us   first/later per run "
                  f"{[round(f / m, 1) if m else None for f, m in zip(first, later, strict=True)]}")


if __name__ == "__main__":
    main()
