"""redline serving against the floors and FastAPI, in one run, as ratios.

Every server is started pinned to CPU 0 and measured with ``redline bench`` pinned to CPU 1,
closed loop at concurrency 1, 8 and 32, on a demo forest (100 trees, depth 8, breast cancer,
one FP32 row of 30 features) trained here. Servers run side by side, idle when not measured,
and the measurements go round-robin for ``--rounds`` rounds; the report takes the median of
each cell with its lowest and highest round, and each ratio per round, so a slow minute on a
shared machine hits every server alike.

The floors (``floors/``: a bare ASGI callable, FastAPI, a bare grpc.aio servicer, each with ONNX
Runtime) run in their own virtual environment, the ``floors`` peer of ``benchmarks/peers/``
(made on first use); nginx's canned answer joins when ``nginx`` is on the PATH
(``benchmarks/peers/setup.sh`` installs it). Batching is measured on an MLP of three 1024-wide
layers on scikit-learn's digits, redline against the FastAPI service serving the same ONNX file,
at concurrency 32.

Usage (from the repository root):

    python benchmarks/serving/compare.py --rounds 3 --duration 3 --out results.json

``--mlserver`` adds MLServer (the ``mlserver`` peer of ``benchmarks/peers/``, made on first
use) on the same forest, trained in its own environment; ``--perf-analyzer`` adds Triton's
perf_analyzer cross-check (REST JSON, c=1 and 8) against redline and FastAPI (the
``perf-analyzer`` peer). ``--baseline REF`` serves redline as of a git commit beside today's
(same cells, same rounds, one more server pinned to the same core) and adds today's against it
per protocol and concurrency (``baseline`` in the JSON): how a refactor of the hot path is
checked, e.g. ``--baseline 6c87ffb^`` for the code before the V2 path became one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOORS = Path(__file__).resolve().parent / "floors"
PEERS = ROOT / "benchmarks" / "peers"
sys.path.insert(0, str(ROOT))  # run as a script, the repository root may not be on the path
from benchmarks.peers import envs  # noqa: E402
from benchmarks.peers import procs as peer_procs  # noqa: E402

PY = sys.executable
TARGETS = {  # redline's serving targets, as ratios measured in the same run
    "rest_json_c1_p50_vs_nginx": ("<=", 2.3),
    "rest_json_c1_p99_vs_nginx": ("<=", 2.5),
    "rest_json_c8_rps_vs_fastapi": (">=", 1.5),
    "rest_json_c8_rps_vs_raw_asgi": (">=", 0.85),
    "rest_json_c8_p99_vs_fastapi": ("<=", 0.7),
    "mlp_c32_rps_vs_fastapi": (">=", 1.8),
    "grpc_c8_rps_vs_raw_grpc": (">=", 0.77),
}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_http(port: int, path: str = "/v2/health/ready", timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server on port {port} never became ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/serving/results.json")
    ap.add_argument("--floor-python", type=Path, default=None,
                    help="the floors' interpreter (default: the floors peer's, made when missing)")
    ap.add_argument("--mlserver", action="store_true", help="also measure MLServer (slow)")
    ap.add_argument("--mlserver-python", type=Path, default=None,
                    help="MLServer's interpreter (default: the mlserver peer's, made when "
                    "missing)")
    ap.add_argument("--baseline", metavar="REF", default=None,
                    help="also serve redline as of this git commit (its src/ from git archive) "
                    "in the same rounds and cells, and report today's against it "
                    "(e.g. --baseline 6c87ffb^: the code before a refactor)")
    ap.add_argument("--perf-analyzer", action="store_true",
                    help="also cross-check with Triton's perf_analyzer (the perf-analyzer peer)")
    args = ap.parse_args()
    floor_py = args.floor_python or envs.ensure("floors")
    mlserver_py = (args.mlserver_python or envs.ensure("mlserver")) if args.mlserver else None
    nginx = shutil.which("nginx")
    if not nginx:
        print("nginx is not installed: the protocol floor is left out "
              "(apt-get install nginx adds it)", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(prefix="redline-bench-"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    # Every server inherits this run's tag: whatever one of them starts (MLServer's workers) is
    # found and stopped at the end, however it detached.
    tag = peer_procs.new_tag()
    os.environ[peer_procs.TAG_VARIABLE] = tag
    try:
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        subprocess.run([PY, "-c", _PREPARE, str(scratch)], check=True, env=env)
        (scratch / "nginx").mkdir()

        def start(name: str, cmd: list[str], cwd: Path, port: int,
                  extra_env: dict[str, str] | None = None) -> None:
            log = open(scratch / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
            procs[name] = subprocess.Popen(["taskset", "-c", "0", *cmd], cwd=cwd, stdout=log,
                                           stderr=subprocess.STDOUT,
                                           env={**os.environ, **(extra_env or {})})
            if port:
                wait_http(port)

        rl = [PY, "-m", "redline.cli", "serve", "--no-watch"]
        # One server process, as every floor here: two workers pinned to the one core would
        # time-slice against each other.
        one = {"REDLINE_SCALING__WORKERS": "1"}
        start("redline", [*rl, "--repository", str(scratch / "repo"), "--http-port", "8300",
                          "--grpc-port", "8301"], ROOT, 8300, one)
        start("redline_mlp", [*rl, "--repository", str(scratch / "mlprepo"), "--http-port",
                              "8320", "--grpc-port", "8321"], ROOT, 8320, one)
        if args.baseline:  # the same command on the older sources, found first on the path
            tree = subprocess.run(["git", "archive", args.baseline, "src"], cwd=ROOT,
                                  capture_output=True, check=True).stdout
            (scratch / "baseline").mkdir()
            subprocess.run(["tar", "-x", "-C", str(scratch / "baseline")], input=tree,
                           check=True)
            start("baseline", [*rl, "--repository", str(scratch / "repo"), "--http-port",
                               "8310", "--grpc-port", "8311"], ROOT, 8310,
                  {**one, "PYTHONPATH": str(scratch / "baseline" / "src")})
        if nginx:
            start("nginx", [nginx, "-p", str(scratch / "nginx"), "-c",
                            str(FLOORS / "nginx.conf")], scratch, 8090)
        uv = ["-m", "uvicorn", "--http", "httptools", "--loop", "uvloop", "--no-access-log"]
        rf, mlp = {"MODEL": str(scratch / "rf.onnx")}, {"MODEL": str(scratch / "mlp.onnx")}
        start("raw_asgi", [str(floor_py), *uv, "bare_asgi:app", "--port", "8097"], FLOORS, 8097,
              rf)
        start("fastapi", [str(floor_py), *uv, "fastapi_onnx:app", "--port", "8095"], FLOORS,
              8095, rf)
        start("fastapi_mlp", [str(floor_py), *uv, "fastapi_onnx:app", "--port", "8096"], FLOORS,
              8096, mlp)
        start("raw_grpc", [str(floor_py), "bare_grpc.py"], FLOORS, 0, {**rf, "PORT": "8098"})
        if mlserver_py:
            (scratch / "mlserver").mkdir()
            subprocess.run([str(mlserver_py), str(PEERS / "mlserver" / "model.py"),
                            str(scratch / "mlserver"), "8080", "8081", "8082"], check=True)
            start("mlserver", [str(mlserver_py.parent / "mlserver"), "start", "."],
                  scratch / "mlserver", 8080)
        time.sleep(3)

        rf_in, mlp_in = "X:FP32:1x30", "X:FP32:1x64"
        cells: list[tuple[str, str, str, int, str]] = []  # server, protocol, url, c, input
        for c in (1, 8, 32):
            if nginx:
                cells.append(("nginx", "json", "http://127.0.0.1:8090", c, rf_in))
            cells += [("raw_asgi", "json", "http://127.0.0.1:8097", c, rf_in),
                      ("fastapi", "json", "http://127.0.0.1:8095", c, rf_in),
                      ("redline", "json", "http://127.0.0.1:8300", c, rf_in),
                      ("redline", "binary", "http://127.0.0.1:8300", c, rf_in),
                      ("raw_grpc", "grpc", "127.0.0.1:8098", c, rf_in),
                      ("redline", "grpc", "127.0.0.1:8301", c, rf_in)]
            if args.baseline:
                cells += [("baseline", "json", "http://127.0.0.1:8310", c, rf_in),
                          ("baseline", "binary", "http://127.0.0.1:8310", c, rf_in),
                          ("baseline", "grpc", "127.0.0.1:8311", c, rf_in)]
            if args.mlserver:
                cells += [("mlserver", "json", "http://127.0.0.1:8080", c, rf_in)]
        cells += [("fastapi_mlp", "json", "http://127.0.0.1:8096", 32, mlp_in),
                  ("redline_mlp", "json", "http://127.0.0.1:8320", 32, mlp_in)]
        runs: dict[tuple[str, str, int], list[dict]] = {}  # type: ignore[type-arg]
        for r in range(args.rounds):
            for server, proto, url, c, inp in cells:
                pid = procs[server].pid
                before = cpu_seconds(pid)
                cmd = [PY, "-m", "redline.cli", "bench", "--url", url, "--model", "rf",
                       "--input", inp, "--protocol", proto, "-c", str(c),
                       "--duration", str(args.duration), "--warmup", str(args.warmup), "--json"]
                done = subprocess.run(["taskset", "-c", "1", *cmd], capture_output=True,
                                      text=True, cwd=ROOT)
                if done.returncode:
                    print(f"{server} {proto} c={c}: {done.stderr[-300:]}", file=sys.stderr)
                    continue
                report = json.loads(done.stdout)
                report["server_cpu_us_per_req"] = round(
                    (cpu_seconds(pid) - before) * 1e6 / max(1, report["ok"]), 1)
                report["round"] = r
                runs.setdefault((server, proto, c), []).append(report)
                lat = report["latency_ms"]
                print(f"round {r + 1} {server:12s} {proto:6s} c={c:<3d} "
                      f"{report['throughput_rps']:>9.0f} req/s  p50 {lat['p50']:.3f}  "
                      f"p99 {lat['p99']:.3f} ms", flush=True)
        pa = _perf_analyzer(envs.ensure("perf-analyzer")) if args.perf_analyzer else {}
        summary = _summarize(runs)
        command = " ".join(sys.argv)  # machine paths replaced by the names the docs use
        for path, name in ((args.mlserver_python, "$MLSERVER_PYTHON"),
                           (args.floor_python, "$FLOOR_PYTHON")):
            if path is not None:
                command = command.replace(str(path), name)
        result = {"command": command, "rounds": args.rounds, "duration_s": args.duration,
                  "cells": summary, "ratios": _ratios(summary, runs), "perf_analyzer": pa}
        if args.baseline:
            result["baseline"] = {"ref": args.baseline, "ratios": _ratios(summary, runs,
                                                                          _baseline_pairs())}
        args.out.write_text(json.dumps(result, indent=2))
        print(_markdown(result))
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        peer_procs.stop_tagged(tag, grace_s=5)
        shutil.rmtree(scratch, ignore_errors=True)


def _perf_analyzer(python: Path) -> dict[str, str]:
    """perf_analyzer (it lies beside its environment's python) against redline and FastAPI; it
    loads libcudart from the CUDA runtime wheel of the same environment."""
    binary = python.parent / "perf_analyzer"
    runtime = next(python.parent.parent.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    env = {**os.environ, "LD_LIBRARY_PATH": str(runtime)}
    found: dict[str, str] = {}
    for name, port in (("redline", 8300), ("fastapi", 8095)):
        for c in (1, 8):
            done = subprocess.run(
                ["taskset", "-c", "1", str(binary), "-m", "rf", "-u", f"127.0.0.1:{port}",
                 "-i", "http", "--input-tensor-format=json", "--output-tensor-format=json",
                 "--shape", ("X" if name == "redline" else "input-0") + ":1,30",
                 "--concurrency-range", str(c), "-p", "2000", "-r", "6", "-s", "50"],
                capture_output=True, text=True, env=env)
            line = [x for x in done.stdout.splitlines() if x.startswith("Concurrency:")]
            found[f"{name}_c{c}"] = line[-1] if line else done.stdout[-300:]
    return found


def _summarize(runs: dict) -> list[dict]:  # type: ignore[type-arg]
    """Per cell: the median of the rounds, and the lowest and highest round for req/s and p99."""
    cells = []
    for (server, proto, c), reports in runs.items():
        def med(f, reports=reports):  # type: ignore[no-untyped-def]
            return round(statistics.median(f(r) for r in reports), 4)
        rps = [r["throughput_rps"] for r in reports]
        p99 = [r["latency_ms"]["p99"] for r in reports]
        cells.append({
            "server": server, "protocol": proto, "concurrency": c, "runs": len(reports),
            "rps": med(lambda r: r["throughput_rps"]),
            "rps_min": round(min(rps), 1), "rps_max": round(max(rps), 1),
            "p50_ms": med(lambda r: r["latency_ms"]["p50"]),
            "p90_ms": med(lambda r: r["latency_ms"]["p90"]),
            "p99_ms": med(lambda r: r["latency_ms"]["p99"]),
            "p99_ms_min": round(min(p99), 4), "p99_ms_max": round(max(p99), 4),
            "server_cpu_us_per_req": med(lambda r: r["server_cpu_us_per_req"]),
            "errors": sum(sum(r["errors"].values()) for r in reports),
        })
    return cells


PAIRS = {  # ratio name: (measured cell, reference cell, metric)
    "rest_json_c1_p50_vs_nginx": (("redline", "json", 1), ("nginx", "json", 1), "p50"),
    "rest_json_c1_p99_vs_nginx": (("redline", "json", 1), ("nginx", "json", 1), "p99"),
    "rest_json_c8_rps_vs_fastapi": (("redline", "json", 8), ("fastapi", "json", 8), "rps"),
    "rest_json_c8_rps_vs_raw_asgi": (("redline", "json", 8), ("raw_asgi", "json", 8), "rps"),
    "rest_json_c8_p99_vs_fastapi": (("redline", "json", 8), ("fastapi", "json", 8), "p99"),
    "mlp_c32_rps_vs_fastapi": (("redline_mlp", "json", 32), ("fastapi_mlp", "json", 32), "rps"),
    "grpc_c8_rps_vs_raw_grpc": (("redline", "grpc", 8), ("raw_grpc", "grpc", 8), "rps"),
    "rest_json_c1_p50_vs_raw_asgi": (("redline", "json", 1), ("raw_asgi", "json", 1), "p50"),
    "rest_json_c1_p50_raw_asgi_vs_nginx": (("raw_asgi", "json", 1), ("nginx", "json", 1), "p50"),
}


def _metric(report: dict, metric: str) -> float:  # type: ignore[type-arg]
    return float(report["throughput_rps"] if metric == "rps" else report["latency_ms"][metric])


def _baseline_pairs() -> dict[str, tuple[tuple[str, str, int], tuple[str, str, int], str]]:
    """Today's redline against the baseline's, per protocol and concurrency: throughput, p50
    and p99 (throughput over 1 when today's is faster; the latencies under 1)."""
    return {f"{proto}_c{c}_{metric}_vs_baseline": (("redline", proto, c),
                                                   ("baseline", proto, c), metric)
            for proto in ("json", "binary", "grpc") for c in (1, 8, 32)
            for metric in ("rps", "p50", "p99")}


def _ratios(cells: list[dict], runs: dict, pairs: dict | None = None  # type: ignore[type-arg]
            ) -> dict[str, dict]:  # type: ignore[type-arg]
    """Each ratio of the medians, and its lowest and highest value over the rounds (a round's
    two cells were measured minutes apart at most, in the same round-robin pass)."""
    out = {}
    for key, (a, b, metric) in (PAIRS if pairs is None else pairs).items():
        ra, rb = runs.get(a, []), runs.get(b, [])
        if not ra or not rb:
            continue
        ma = statistics.median(_metric(r, metric) for r in ra)
        mb = statistics.median(_metric(r, metric) for r in rb)
        if not mb:
            continue
        by_round = {r["round"]: _metric(r, metric) for r in rb}
        per_round = [_metric(r, metric) / by_round[r["round"]] for r in ra
                     if by_round.get(r["round"])]
        entry: dict[str, object] = {"ratio": round(ma / mb, 3),
                                    "min": round(min(per_round), 3),
                                    "max": round(max(per_round), 3)}
        if key in TARGETS:
            op, bound = TARGETS[key]
            entry["target"] = f"{op} {bound}"
            entry["met"] = entry["ratio"] <= bound if op == "<=" else entry["ratio"] >= bound
        out[key] = entry
    return out


def _markdown(result: dict) -> str:  # type: ignore[type-arg]
    lines = ["| server | protocol | c | req/s (min–max) | p50 ms | p99 ms (min–max) | "
             "server CPU µs/req | errors |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in sorted(result["cells"], key=lambda x: (x["concurrency"], x["protocol"],
                                                   x["server"])):
        lines.append(f"| {x['server']} | {x['protocol']} | {x['concurrency']} | "
                     f"{x['rps']:,.0f} ({x['rps_min']:,.0f}–{x['rps_max']:,.0f}) | "
                     f"{x['p50_ms']:.3f} | {x['p99_ms']:.3f} ({x['p99_ms_min']:.3f}–"
                     f"{x['p99_ms_max']:.3f}) | {x['server_cpu_us_per_req']} | {x['errors']} |")
    lines += ["", "| ratio | measured | min–max over rounds | target | met |",
              "| --- | --- | --- | --- | --- |"]
    for key, e in result["ratios"].items():
        met = {True: "yes", False: "**no**"}.get(e.get("met"), "-")  # type: ignore[arg-type]
        lines.append(f"| {key} | {e['ratio']} | {e['min']}–{e['max']} | "
                     f"{e.get('target', '-')} | {met} |")
    return "\n".join(lines)


_PREPARE = r"""
import sys, warnings
warnings.filterwarnings("ignore")
from pathlib import Path
import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.ensemble import RandomForestClassifier
from sklearn.neural_network import MLPClassifier
from skl2onnx import to_onnx
from redline.models import ModelRepository
scratch = Path(sys.argv[1])
X, y = load_breast_cancer(return_X_y=True)
X = X.astype(np.float32)
rf = RandomForestClassifier(n_estimators=100, max_depth=8, random_state=0).fit(X, y)
onx = to_onnx(rf, X[:1], options={id(rf): {"zipmap": False}}, target_opset=17)
(scratch / "rf.onnx").write_bytes(onx.SerializeToString())
ModelRepository(scratch / "repo").add_onnx("rf", scratch / "rf.onnx")
X, y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32)
mlp = MLPClassifier(hidden_layer_sizes=(1024, 1024, 1024), max_iter=3, random_state=0).fit(X, y)
onx = to_onnx(mlp, X[:1], options={id(mlp): {"zipmap": False}}, target_opset=17)
(scratch / "mlp.onnx").write_bytes(onx.SerializeToString())
ModelRepository(scratch / "mlprepo").add_onnx("rf", scratch / "mlp.onnx")
"""

if __name__ == "__main__":
    main()
