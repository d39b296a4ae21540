"""What monitoring costs at capacity: the demo's ``/v1`` and V2 REST at 8 clients (closed loop),
monitoring on against off, in alternating turns, with each server's CPU time per request.

Two ``redline serve`` processes of the demo (``make demo`` first) run side by side, one with
``REDLINE_MONITORING__ENABLED=false``; ``redline bench`` drives one at a time for ``--seconds``,
the order swapping every round so the machine's noise lands on both. Throughput at capacity is
bounded by CPU per request on these two cores, so the server's CPU microseconds per request
(utime + stime from /proc) is the steadier figure; both are reported with the median and range
of the per-round on/off ratios.

``--together`` drives both servers at once instead: on a busy machine the noise then lands on
both within the same seconds, each getting about half of what is left.

    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/capacity.py --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.observability.overhead import wait_ready
from tests.conftest import free_port

DEMO = Path(".redline/demo")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(monitoring: bool) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ}
    if not monitoring:
        env["REDLINE_MONITORING__ENABLED"] = "false"
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline.cli", "serve", "--config", str(DEMO / "redline.yaml"),
         "--http-port", str(port), "--no-grpc", "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, timeout=120)
    return proc, port


def bench_proc(port: int, api: str, seconds: float) -> subprocess.Popen[str]:
    url = f"http://127.0.0.1:{port}"
    if api == "v1":
        args = ["--model", "fraud", "--v1", (DEMO / "fraud-request.json").read_text()]
    else:
        args = ["--model", "breast_cancer"]  # inputs from the model's metadata
    return subprocess.Popen(
        [sys.executable, "-m", "redline.cli", "bench", "--url", url, *args, "--concurrency", "8",
         "--duration", str(seconds), "--json"], stdout=subprocess.PIPE, text=True)


def answered(proc: subprocess.Popen[str]) -> int:
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"redline bench failed with exit code {proc.returncode}")
    return int(json.loads(out)["ok"])


def bench(port: int, api: str, seconds: float) -> int:
    return answered(bench_proc(port, api, seconds))


def drive(servers: dict[str, tuple[subprocess.Popen[bytes], int]], api: str,
          seconds: float) -> dict[str, tuple[float, float]]:
    """The given servers driven at the same time: (req/s, server CPU µs a request) each."""
    cpu0 = {name: cpu_seconds(proc.pid) for name, (proc, _) in servers.items()}
    began = time.monotonic()
    clients = {name: bench_proc(port, api, seconds) for name, (_, port) in servers.items()}
    ok = {name: answered(client) for name, client in clients.items()}
    wall = time.monotonic() - began
    return {name: (ok[name] / wall,
                   (cpu_seconds(proc.pid) - cpu0[name]) / max(ok[name], 1) * 1e6)
            for name, (proc, _) in servers.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--apis", default="v1,v2")
    parser.add_argument("--together", action="store_true",
                        help="drive both servers at once instead of in turns: on a busy machine "
                             "both then meet the same noise (each gets about half the CPU)")
    parser.add_argument("--settle", type=float, default=45.0,
                        help="seconds of load before measuring: drift thresholds are calibrated "
                             "after start and the prediction baseline once its first window fills")
    args = parser.parse_args()
    servers = {"on": start(True), "off": start(False)}
    settle_until = time.monotonic() + args.settle
    while time.monotonic() < settle_until:  # traffic fills the windows: calibrations happen now
        for _, port in servers.values():
            bench(port, "v1", 2.0)
    ratios: dict[str, dict[str, list[float]]] = {}
    try:
        for r in range(args.rounds):
            order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
            for api in args.apis.split(","):
                if args.together:
                    got = drive(servers, api, args.seconds)
                else:
                    got = {}
                    for name in order:
                        got.update(drive({name: servers[name]}, api, args.seconds))
                rate = got["on"][0] / got["off"][0]
                cpu = got["on"][1] / got["off"][1]
                ratios.setdefault(api, {"rate": [], "cpu": []})
                ratios[api]["rate"].append(rate)
                ratios[api]["cpu"].append(cpu)
                print(f"round {r + 1} {api}: req/s on/off {rate:.3f} "
                      f"({got['on'][0]:,.0f} vs {got['off'][0]:,.0f}); CPU µs/req on/off "
                      f"{cpu:.3f} ({got['on'][1]:.0f} vs {got['off'][1]:.0f})", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    for api, rs in ratios.items():
        print(f"{api}: throughput on/off median {statistics.median(rs['rate']):.3f} "
              f"[{min(rs['rate']):.3f}-{max(rs['rate']):.3f}], CPU per request on/off median "
              f"{statistics.median(rs['cpu']):.3f} [{min(rs['cpu']):.3f}-{max(rs['cpu']):.3f}]; "
              f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
