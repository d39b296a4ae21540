"""Throughput at p99 <= 5 ms with 1 and with 2 worker processes (``redline serve --workers``).

Both servers run at once on this machine (so they see the same noise), and ``redline bench
--find-max --slo-p99 5`` searches each one's highest open-loop rate in turns: 1 worker, 2
workers, 1 worker, 2 workers... The ratio is taken per round and the median reported.

Two models: ``affine`` (a few µs of inference: the request path - HTTP, decode, encode - is
the cost) and ``matmul`` (~0.5 ms of ONNX Runtime per request: the model is the cost).

On a 2-core machine the load generator needs CPU too, so 2 workers cannot double anything:
the generator and the two workers share two cores. Read the ratio with that in mind.

    PYTHONPATH=src:. .venv/bin/python benchmarks/scaling/workers.py --rounds 3 \\
        --json-out benchmarks/scaling/results-workers.json
"""

from __future__ import annotations

import argparse
import json
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


def start(root: Path, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = root / f"w{workers}.yaml"
    config.write_text("runtime:\n  warmup_batch_sizes: [1]\nserver:\n  watch_repository: false\n")
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


def bench(*args: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run([sys.executable, "-m", "redline.cli", "bench", *args, "--json"],
                          capture_output=True, text=True, timeout=600)
    doc: dict = json.loads(done.stdout) if done.stdout.strip() else {}  # type: ignore[type-arg]
    return doc


def find_max(url: str, model: str, start_rate: int, duration: float) -> float:
    """Highest open-loop rate with p99 <= 5 ms (0 when even the lowest rate tried misses it)."""
    doc = bench("--url", url, "-m", model, "--find-max", "--slo-p99", "5", "--rate",
                str(start_rate), "--duration", str(duration), "--warmup", "0.5")
    return float(doc.get("max_rate") or 0.0)


def closed_loop(url: str, model: str, duration: float) -> float:
    """Throughput with 16 requests always in flight (no latency bound): capacity alone."""
    doc = bench("--url", url, "-m", model, "-c", "16", "--duration", str(duration),
                "--warmup", "0.5")
    return float(doc.get("throughput_rps") or 0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="redline-workers-bench-"))
    repo = ModelRepository(root / "repo")
    repo.add_onnx("affine", affine_model())
    repo.add_onnx("matmul", slow_affine(layers=12))
    servers = {n: start(root, n) for n in (1, 2)}
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for model, rate in (("affine", 1000), ("matmul", 300)):
            runs: dict[str, list[float]] = {"1": [], "2": [], "ratio": [], "closed_1": [],
                                            "closed_2": [], "closed_ratio": []}
            for _ in range(args.rounds):
                one = find_max(servers[1][1], model, rate, args.duration)
                two = find_max(servers[2][1], model, rate, args.duration)
                c1 = closed_loop(servers[1][1], model, args.duration)
                c2 = closed_loop(servers[2][1], model, args.duration)
                runs["1"].append(one)
                runs["2"].append(two)
                runs["ratio"].append(two / one if one else 0.0)
                runs["closed_1"].append(c1)
                runs["closed_2"].append(c2)
                runs["closed_ratio"].append(c2 / c1 if c1 else 0.0)
                print(f"{model}: p99<=5ms 1 worker {one:.0f}/s, 2 workers {two:.0f}/s; "
                      f"closed loop c=16 {c1:.0f}/s vs {c2:.0f}/s", flush=True)
            results[model] = runs
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    summary = {m: {"max_rate_1_worker": statistics.median(r["1"]),
                   "max_rate_2_workers": statistics.median(r["2"]),
                   "median_ratio": statistics.median(r["ratio"]),
                   "closed_loop_median_ratio": statistics.median(r["closed_ratio"]), "runs": r}
               for m, r in results.items()}
    print(json.dumps(summary, indent=2))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
