"""Server CPU per request, interleaved: the bare floor, redline, and optionally an older
redline, on the demo forest (one FP32 row of 30 features; REST JSON against the bare ASGI
floor, or with ``--protocol grpc`` V2 gRPC against the bare grpc.aio floor).

Why a separate script: on a shared 2-core machine throughput and latency swing with other
people's work, while the server process's CPU time per request barely moves. All servers run
at once (pinned to CPU 0, the load tool to CPU 1) and are measured in short alternating runs,
so noise hits each alike; the median over rounds is reported.

The floors are ``floors/bare_asgi.py`` and ``floors/bare_grpc.py`` in their own environment
(the ``floors`` peer of ``benchmarks/peers/``, made on first use). Usage (from the repository
root)::

    git archive <rev> src | tar -x -C "$BEFORE"      # optional: an older redline to compare
    .venv/bin/python benchmarks/serving/ab_cpu.py --before "$BEFORE/src" -c 8 --rounds 9 \
        --duration 2 [--protocol grpc]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import FLOORS, PY, ROOT, cpu_seconds, envs, wait_http  # noqa: E402

# The demo forest of compare.py (100 trees, depth 8, breast cancer), as ONNX and in a repository.
_FOREST = r"""
import sys
from pathlib import Path
import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.ensemble import RandomForestClassifier
from skl2onnx import to_onnx
from redline.models import ModelRepository
scratch = Path(sys.argv[1])
X, y = load_breast_cancer(return_X_y=True)
X = X.astype(np.float32)
rf = RandomForestClassifier(n_estimators=100, max_depth=8, random_state=0).fit(X, y)
onx = to_onnx(rf, X[:1], options={id(rf): {"zipmap": False}}, target_opset=17)
(scratch / "rf.onnx").write_bytes(onx.SerializeToString())
ModelRepository(scratch / "repo").add_onnx("rf", scratch / "rf.onnx")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, help="src/ of another redline tree (PYTHONPATH)")
    ap.add_argument("--before-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of redline_before (this tree unless --before), e.g. "
                         "REDLINE_SERVER__GIL_SWITCH_INTERVAL_MS=5")
    ap.add_argument("-c", "--concurrency", type=int, default=8)
    ap.add_argument("--protocol", choices=("json", "grpc"), default="json",
                    help="REST JSON against the bare ASGI floor, or V2 gRPC against bare grpc.aio")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--no-monitoring", action="store_true",
                    help="serve this tree with monitoring.enabled false (no request observers), "
                         "to compare the request path alone with an older tree")
    args = ap.parse_args()
    floor_py = str(envs.ensure("floors"))
    scratch = Path(tempfile.mkdtemp(prefix="redline-ab-"))
    subprocess.run([PY, "-W", "ignore", "-c", _FOREST, str(scratch)], check=True)
    uv = ["-m", "uvicorn", "--http", "httptools", "--loop", "uvloop", "--no-access-log"]
    serve = [PY, "-m", "redline.cli", "serve", "--no-watch", "--repository", str(scratch / "repo")]
    grpc = args.protocol == "grpc"
    floor = (("raw_grpc", [floor_py, "bare_grpc.py"], 0) if grpc else
             ("raw_asgi", [floor_py, *uv, "bare_asgi:app", "--port", "8097"], 8097))
    # name -> (command, cwd, HTTP port to wait for (0: none), environment)
    servers: dict[str, tuple[list[str], Path, int, dict[str, str]]] = {
        floor[0]: (floor[1], FLOORS, floor[2], {"MODEL": str(scratch / "rf.onnx"),
                                                "PORT": "8098"}),
        # One process: `redline serve` defaults to a worker per core (scaling.workers: 0), and
        # this measures one server process's CPU per request.
        "redline": ([*serve, "--http-port", "8300", "--grpc-port", "8301"], ROOT, 8300,
                    {"REDLINE_SCALING__WORKERS": "1",
                     **({"REDLINE_MONITORING__ENABLED": "false"} if args.no_monitoring else {})}),
    }
    if args.before or args.before_env:
        env = {"REDLINE_SCALING__WORKERS": "1",
               **({"PYTHONPATH": str(args.before.resolve())} if args.before else {}),
               **dict(kv.split("=", 1) for kv in args.before_env)}
        servers["redline_before"] = ([*serve, "--http-port", "8350", "--grpc-port", "8351"],
                                     scratch if args.before else ROOT, 8350, env)
    procs = {}
    try:
        for name, (cmd, cwd, port, env) in servers.items():
            procs[name] = subprocess.Popen(["taskset", "-c", "0", *cmd], cwd=cwd,
                                           env={**os.environ, **env},
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if port:
                wait_http(port, "/v2/health/live")
        time.sleep(3 if grpc else 2)  # the bare grpc.aio server has no HTTP to wait for
        # where the load goes: the HTTP port, or the gRPC port beside it (8098 for the floor)
        urls = {name: (f"127.0.0.1:{port + 1 if port else 8098}" if grpc
                       else f"http://127.0.0.1:{port}") for name, (_, _, port, _) in
                servers.items()}
        rows: dict[str, list[tuple[float, float, float, float]]] = {n: [] for n in servers}
        for _ in range(args.rounds):
            for name in servers:
                before = cpu_seconds(procs[name].pid)
                done = subprocess.run(
                    ["taskset", "-c", "1", PY, "-m", "redline.cli", "bench", "--url",
                     urls[name], "--protocol", args.protocol, "--model", "rf",
                     "--input", "X:FP32:1x30",
                     "-c", str(args.concurrency), "--duration", str(args.duration),
                     "--warmup", "0.3", "--json"],
                    capture_output=True, text=True, check=True, cwd=ROOT)
                cpu = cpu_seconds(procs[name].pid) - before
                r = json.loads(done.stdout)
                rows[name].append((r["throughput_rps"], r["latency_ms"]["p50"],
                                   r["latency_ms"]["p99"], cpu * 1e6 / max(1, r["ok"])))
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(15)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"medians of {args.rounds} rounds of {args.duration} s\n"
          f"({args.protocol})\n"
          "| server | c | req/s | p50 ms | p99 ms | server CPU µs/req |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for name, rs in rows.items():
        med = [statistics.median(r[i] for r in rs) for i in range(4)]
        print(f"| {name} | {args.concurrency} | {med[0]:,.0f} | {med[1]:.3f} | {med[2]:.3f} | "
              f"{med[3]:.1f} |")


if __name__ == "__main__":
    main()
