"""CPU time of one V2 REST request through the app alone, in process, this tree vs another.

Why: on a shared 2-core machine under heavy load, end-to-end numbers (req/s, p99, even the
server's CPU per request) swing by multiples; the CPU time of calling the ASGI app directly, with
no sockets and no server, swings far less. Each tree runs in its own subprocess (its own
``PYTHONPATH``), the runs alternate (A B B A ...), and the median per-call process CPU time of
each tree is reported, with the ratio.

    .venv/bin/python benchmarks/serving/inprocess_ab.py --model <rf.onnx> \\
        --before <other tree>/src [--rounds 6 --calls 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import asyncio, json, sys, time
import numpy as np, orjson
from redline.config import Settings
from redline.models import ModelRepository
from redline.serving.app import RestApp
from redline.serving.registry import ModelRegistry

repo_dir, calls, observe = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

async def main():
    settings = Settings()
    settings.repository = repo_dir
    settings.server.watch_repository = False
    registry = ModelRegistry(ModelRepository(repo_dir), settings)
    await registry.sync()
    app = RestApp(registry, settings)
    if observe and hasattr(app, "observers"):
        class Nop:
            def request_finished(self, record):
                pass
        app.observers.add(Nop())
    x = np.load(sys.argv[4]).astype(np.float32)
    body = orjson.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 30],
                                     "data": x.ravel().tolist()}]})
    scope = {"type": "http", "method": "POST", "path": "/v2/models/rf/infer",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    message = {"type": "http.request", "body": body, "more_body": False}
    async def receive():
        return message
    status = []
    async def send(m):
        if m["type"] == "http.response.start":
            status.append(m["status"])
    for _ in range(2000):
        await app(scope, receive, send)
    status.clear()
    t0 = time.process_time()
    for _ in range(calls):
        await app(scope, receive, send)
    cpu = time.process_time() - t0
    assert set(status) <= {200, 429}, set(status)  # 429: admission under a loaded CPU
    print(json.dumps({"us_per_call": cpu / calls * 1e6}))

asyncio.run(main())
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path, help="the demo forest rf.onnx")
    ap.add_argument("--sample", type=Path, help="sample.npy beside rf.onnx (default)")
    ap.add_argument("--before", required=True, type=Path, help="src/ of the other tree")
    ap.add_argument("--this", type=Path, default=ROOT / "src", help="src/ to measure (default: "
                    "this tree)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--observer", action="store_true",
                    help="add one do-nothing request observer in this tree (stages recorded)")
    args = ap.parse_args()
    sample = args.sample or args.model.with_name("sample.npy")
    repo = Path(tempfile.mkdtemp(prefix="redline-inproc-")) / "repo"
    subprocess.run([sys.executable, "-c", "import sys; from redline.models import "
                    "ModelRepository; ModelRepository(sys.argv[2]).add_onnx('rf', sys.argv[1])",
                    str(args.model), str(repo)], check=True, env={**os.environ,
                                                                 "PYTHONPATH": str(ROOT / "src")})
    trees = {"this tree": str(args.this.resolve()), "before": str(args.before.resolve())}
    results: dict[str, list[float]] = {name: [] for name in trees}
    order = list(trees)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            observe = "1" if args.observer and name == "this tree" else "0"
            out = subprocess.run(
                ["taskset", "-c", "0", sys.executable, "-c", CHILD, str(repo), str(args.calls),
                 observe, str(sample)],
                capture_output=True, text=True, env={**os.environ, "PYTHONPATH": trees[name]})
            if out.returncode:
                raise SystemExit(f"{name} failed:\n{out.stderr[-2000:]}")
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1])["us_per_call"])
    med = {name: statistics.median(v) for name, v in results.items()}
    print(f"median of {args.rounds} runs of {args.calls} calls, process CPU µs per request")
    for name, values in results.items():
        print(f"{name}: {med[name]:.1f} µs  (runs: {', '.join(f'{v:.1f}' for v in values)})")
    print(f"ratio this tree / before: {med['this tree'] / med['before']:.3f}")


if __name__ == "__main__":
    main()
