"""Throughput at p99 <= 5 ms with 1 and with 2 worker processes (``redline serve --workers``).

Both servers run at once on this machine (so they see the same noise; the idle one costs
nothing), and each is measured in turns: 1 worker, 2 workers, 1 worker, 2 workers...

The load generator is wrk (Debian's, installed by ``tools/services.d/55-wrk.sh``): C, a few µs
of CPU per request, where a Python generator would take a large part of a core from the
workers it measures. Each wrk connection waits a random 0-10 ms (5 ms on average) between
its answer and its next request, so the offered rate is set by the number of connections
(about connections / 5.2 ms) and requests arrive spread out rather than back to back: close to
an open loop, where a flood of back-to-back requests would measure only queueing. The search
raises the connections (4 ... 512) and keeps the highest throughput whose p99 is still <= 5 ms.
Every step records the CPU seconds of wrk (``RUSAGE_CHILDREN``) and of the server's processes
(``/proc``), so the report says how much of the two cores the generator took and how many
requests each CPU-second of the server bought.

``--monitoring off`` serves with ``monitoring.enabled: false`` (the default is on, as a user
runs it).

Two models: ``affine`` (a few µs of inference: the request path - HTTP, decode, encode - is
the cost) and ``matmul`` (~0.3 ms of ONNX Runtime per request: the model is the cost).

    PYTHONPATH=src:. .venv/bin/python benchmarks/scaling/workers.py --rounds 3 \\
        --json-out benchmarks/scaling/results-workers.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from redline.models import ModelRepository
from tests.conftest import free_port
from tests.scaling.models import slow_affine
from tests.serving.helpers import affine_model

SLO_MS = 5.0
CONNECTIONS = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
BODY = ('{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}')
TICK = os.sysconf("SC_CLK_TCK")


def start(root: Path, workers: int, monitoring: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = root / f"w{workers}.yaml"
    config.write_text("runtime:\n  warmup_batch_sizes: [1]\nserver:\n  watch_repository: false\n"
                      f"monitoring:\n  enabled: {'true' if monitoring else 'false'}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline.cli", "serve", "--config", str(config), "-r",
         str(root / "repo"), "--http-port", str(port), "--no-grpc", "--workers", str(workers),
         "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                time.sleep(2 * workers)  # every worker up, not just the first
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


def server_cpu_s(pid: int) -> float:
    """CPU seconds of a server: the process and its children (the workers), live ones read
    from /proc."""
    pids = [pid]
    try:
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def _ms(text: str) -> float:
    """wrk's latency text (``812.00us``, ``4.03ms``, ``1.20s``, ``2.00m``) in ms; anything else
    (a run with no answers) counts as missing the objective."""
    found = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if found is None:
        return float("inf")
    return float(found.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[found.group(2)]


def wrk(url: str, model: str, connections: int, duration: float, script: Path,
        server_pid: int) -> dict[str, float]:
    before_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    before_srv = server_cpu_s(server_pid)
    t0 = time.monotonic()
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency",
         "-s", str(script), f"{url}/v2/models/{model}/infer"],
        capture_output=True, text=True, timeout=60).stdout
    wall = time.monotonic() - t0
    after_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    srv = server_cpu_s(server_pid) - before_srv
    gen = (after_cpu.ru_utime - before_cpu.ru_utime) + (after_cpu.ru_stime - before_cpu.ru_stime)
    found_rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    found_p99 = re.search(r"\s99%\s+(\S+)", out)
    rps = float(found_rps.group(1)) if found_rps else 0.0
    p99 = _ms(found_p99.group(1)) if found_p99 else float("inf")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"connections": connections, "rps": rps, "p99_ms": p99,
            "non_2xx": int(errors.group(1)) if errors else 0,
            "wrk_cores": gen / wall, "server_cores": srv / wall,
            "requests_per_server_cpu_s": rps * wall / srv if srv else 0.0}


def best_under_slo(url: str, model: str, duration: float, script: Path, pid: int
                   ) -> dict[str, object]:
    """The highest throughput whose p99 <= 5 ms, raising connections until the p99 breaks."""
    steps = []
    best: dict[str, float] | None = None
    misses = 0
    for c in CONNECTIONS:
        step = wrk(url, model, c, duration, script, pid)
        steps.append(step)
        if step["p99_ms"] <= SLO_MS and step["non_2xx"] == 0:
            misses = 0
            if best is None or step["rps"] > best["rps"]:
                best = step
        else:
            misses += 1
            if misses == 2:
                break  # past the knee (one miss may be a hiccup)
    return {"best": best, "steps": steps}


def _say(step: object) -> str:
    if not isinstance(step, dict):
        return "none under the SLO"
    return (f"{step['rps']:.0f}/s (c={step['connections']}, p99 {step['p99_ms']:.2f} ms, "
            f"wrk {step['wrk_cores']:.2f} cores, server {step['server_cores']:.2f} cores)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per wrk step")
    ap.add_argument("--models", default="affine,matmul")
    ap.add_argument("--monitoring", choices=("on", "off"), default="on")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="redline-workers-bench-"))
    repo = ModelRepository(root / "repo")
    repo.add_onnx("affine", affine_model())
    repo.add_onnx("matmul", slow_affine(layers=12))
    script = root / "post.lua"
    script.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      f"wrk.body = '{BODY}'\n"
                      "function delay() return math.random(0, 10) end\n")
    servers = {n: start(root, n, args.monitoring == "on") for n in (1, 2)}
    results: dict[str, dict[str, list[object]]] = {}
    try:
        for model in args.models.split(","):
            # Warm both servers' connections and every worker's model.
            for proc, url in servers.values():
                wrk(url, model, 8, 1.0, script, proc.pid)
            runs: dict[str, list[object]] = {"1": [], "2": [], "ratio": []}
            for _ in range(args.rounds):
                one = best_under_slo(servers[1][1], model, args.duration, script,
                                     servers[1][0].pid)
                two = best_under_slo(servers[2][1], model, args.duration, script,
                                     servers[2][0].pid)
                runs["1"].append(one)
                runs["2"].append(two)
                b1, b2 = one["best"], two["best"]
                ratio = (b2["rps"] / b1["rps"]) if b1 and b2 else 0.0  # type: ignore[index]
                runs["ratio"].append(ratio)
                print(f"{model}: p99<=5ms 1 worker {_say(b1)}, 2 workers {_say(b2)}: "
                      f"{ratio:.2f}x", flush=True)
            results[model] = runs
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    summary = {m: {"median_ratio": statistics.median(r["ratio"]), "runs": r}  # type: ignore[type-var]
               for m, r in results.items()}
    print(json.dumps({m: s["median_ratio"] for m, s in summary.items()}, indent=2))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
