"""redline serving against the peer servers, in one run, as ratios.

Every server is started pinned to CPU 0 and measured with ``redline bench`` pinned to CPU 1,
closed loop at concurrency 1, 8 and 32, on the peer kit's demo forest (100 trees, depth 8,
breast cancer, one FP32 row of 30 features). Servers run side by side, idle when not measured,
and the measurements go round-robin for ``--rounds`` rounds; the report takes the median of
each cell, so a slow minute on this shared machine hits every server alike.

Batching is measured on an MLP of three 1024-wide layers on scikit-learn's digits (trained here
for a few iterations; accuracy is irrelevant, compute is what matters), redline against the
kit's FastAPI service serving the same ONNX file, at concurrency 32.

Usage (from the repository root, after the kit's setup.sh and train.py in a scratch copy):

    python benchmarks/serving/compare.py --kit KIT_COPY --kit-venv KIT_VENV \\
        --rounds 3 --duration 5 --out benchmarks/serving/results.json

``KIT_COPY`` is the copy of ``../shared/peers/`` where setup.sh and train.py ran, ``KIT_VENV``
the virtual environment setup.sh created. Add ``--perf-analyzer PATH`` for Triton's
perf_analyzer cross-check (REST JSON, c=1 and 8) against redline and FastAPI.
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
PY = sys.executable
TARGETS = {  # the targets, as ratios measured in the same run
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
    ap.add_argument("--kit", required=True, type=Path)
    ap.add_argument("--kit-venv", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/serving/results.json")
    ap.add_argument("--perf-analyzer", type=Path, default=None)
    ap.add_argument("--mlserver", action="store_true", help="also measure MLServer (slow)")
    ap.add_argument("--tool", choices=["redline-bench", "loadgen"], default="redline-bench",
                    help="load tool: redline bench, or the kit's loadgen.py (the tool the "
                    "issue's reference figures were measured with; REST JSON and gRPC only)")
    args = ap.parse_args()
    kit, venv = args.kit.resolve(), args.kit_venv.resolve()
    kit_py = venv / "bin" / "python"
    scratch = Path(tempfile.mkdtemp(prefix="redline-bench-"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        # --- models: the demo forest in a redline repository; the MLP for both servers
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        subprocess.run([PY, "-c", _PREPARE, str(kit / "models" / "rf.onnx"), str(scratch)],
                       check=True, env=env)
        mlp_dir = scratch / "fastapi_mlp"
        (mlp_dir / "models").mkdir(parents=True)
        (mlp_dir / "fastapi_onnx.py").symlink_to(kit / "fastapi_onnx.py")
        shutil.copy(scratch / "mlp.onnx", mlp_dir / "models" / "rf.onnx")
        nginx_prefix = venv.parent / "nginx"
        nginx_prefix.mkdir(parents=True, exist_ok=True)

        def start(name: str, cmd: list[str], cwd: Path, port: int, extra_env=None) -> None:  # type: ignore[no-untyped-def]
            log = open(scratch / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
            procs[name] = subprocess.Popen(["taskset", "-c", "0", *cmd], cwd=cwd, stdout=log,
                                           stderr=subprocess.STDOUT,
                                           env={**os.environ, **(extra_env or {})})
            if port:
                wait_http(port)

        rl = [PY, "-m", "redline.cli", "serve", "--no-watch"]
        # One server process, as every peer here: `serve` starts a worker per core by default
        # (scaling.workers: 0), and two workers pinned to the one core time-slice against each
        # other (measured: c=8 at 0.41x the bare-ASGI floor with p99 4.7 ms, from that alone).
        one = {"REDLINE_SCALING__WORKERS": "1"}
        start("redline", [*rl, "--repository", str(scratch / "repo"), "--http-port", "8300",
                          "--grpc-port", "8301"], ROOT, 8300, one)
        start("redline_mlp", [*rl, "--repository", str(scratch / "mlprepo"), "--http-port",
                              "8320", "--grpc-port", "8321"], ROOT, 8320, one)
        start("nginx", ["nginx", "-p", str(nginx_prefix), "-c", str(kit / "nginx/nginx.conf")],
              kit, 8090)
        uv = ["-m", "uvicorn", "--http", "httptools", "--loop", "uvloop", "--no-access-log"]
        start("raw_asgi", [str(kit_py), *uv, "raw_asgi:app", "--port", "8097"], kit, 8097,
              {"MODEL": str(kit / "models/rf.onnx")})
        start("fastapi", [str(kit_py), *uv, "fastapi_onnx:app", "--port", "8095"], kit, 8095)
        start("fastapi_mlp", [str(kit_py), *uv, "fastapi_onnx:app", "--port", "8096"], mlp_dir,
              8096)
        start("raw_grpc", [str(kit_py), "raw_grpc.py"], kit, 0,
              {"MODEL": str(kit / "models/rf.onnx")})
        if args.mlserver:
            start("mlserver", [str(venv / "bin" / "mlserver"), "start", "."],
                  kit / "models" / "mlserver", 8080)
        time.sleep(3)

        rf_in, mlp_in = "X:FP32:1x30", "X:FP32:1x64"
        cells: list[tuple[str, str, str, int, str]] = []  # server, protocol, url, c, input
        for c in (1, 8, 32):
            cells += [("nginx", "json", "http://127.0.0.1:8090", c, rf_in),
                      ("raw_asgi", "json", "http://127.0.0.1:8097", c, rf_in),
                      ("fastapi", "json", "http://127.0.0.1:8095", c, rf_in),
                      ("redline", "json", "http://127.0.0.1:8300", c, rf_in),
                      ("redline", "binary", "http://127.0.0.1:8300", c, rf_in),
                      ("raw_grpc", "grpc", "127.0.0.1:8098", c, rf_in),
                      ("redline", "grpc", "127.0.0.1:8301", c, rf_in)]
            if args.mlserver:
                cells += [("mlserver", "json", "http://127.0.0.1:8080", c, rf_in)]
        cells += [("fastapi_mlp", "json", "http://127.0.0.1:8096", 32, mlp_in),
                  ("redline_mlp", "json", "http://127.0.0.1:8320", 32, mlp_in)]
        runs: dict[tuple[str, str, int], list[dict]] = {}  # type: ignore[type-arg]
        if args.tool == "loadgen":
            cells = [cell for cell in cells if cell[1] != "binary"]
        for r in range(args.rounds):
            for server, proto, url, c, inp in cells:
                pid = procs[server].pid
                before = cpu_seconds(pid)
                if args.tool == "loadgen":
                    sample = kit / "models/sample.npy" if inp == rf_in else scratch / "mlp.npy"
                    cmd = [str(kit_py), str(kit / "loadgen.py"), "--target", server,
                           "--protocol", "grpc" if proto == "grpc" else "rest",
                           "--port", url.rsplit(":", 1)[1], "--input-name", "X",
                           "--sample", str(sample), "-c", str(c),
                           "--duration", str(args.duration), "--warmup", str(args.warmup)]
                else:
                    cmd = [PY, "-m", "redline.cli", "bench", "--url", url, "--model", "rf",
                           "--input", inp, "--protocol", proto, "-c", str(c),
                           "--duration", str(args.duration), "--warmup", str(args.warmup),
                           "--json"]
                done = subprocess.run(["taskset", "-c", "1", *cmd], capture_output=True,
                                      text=True, cwd=ROOT)
                if done.returncode:
                    print(f"{server} {proto} c={c}: {done.stderr[-300:]}", file=sys.stderr)
                    continue
                if args.tool == "loadgen":  # one JSON line
                    report = _from_loadgen(json.loads(done.stdout.strip().splitlines()[-1]))
                else:
                    report = json.loads(done.stdout)
                report["server_cpu_us_per_req"] = round(
                    (cpu_seconds(pid) - before) * 1e6 / max(1, report["ok"]), 1)
                runs.setdefault((server, proto, c), []).append(report)
                lat = report["latency_ms"]
                print(f"round {r + 1} {server:12s} {proto:6s} c={c:<3d} "
                      f"{report['throughput_rps']:>9.0f} req/s  p50 {lat['p50']:.3f}  "
                      f"p99 {lat['p99']:.3f} ms", flush=True)
        pa = _perf_analyzer(args.perf_analyzer, venv) if args.perf_analyzer else {}
        summary = _summarize(runs)
        command = " ".join(sys.argv)  # machine paths replaced by the names the docs use
        for path, name in ((args.perf_analyzer, "$PERF_ANALYZER"), (args.kit_venv, "$KIT_VENV"),
                           (args.kit, "$KIT")):
            if path is not None:
                command = command.replace(str(path), name)
        result = {"command": command, "tool": args.tool, "rounds": args.rounds,
                  "duration_s": args.duration, "cells": summary, "ratios": _ratios(summary),
                  "perf_analyzer": pa}
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
        shutil.rmtree(scratch, ignore_errors=True)


def _from_loadgen(row: dict) -> dict:  # type: ignore[type-arg]
    """The kit's loadgen.py result row in ``redline bench --json`` form."""
    return {"throughput_rps": row["throughput_rps"], "ok": row["n_lat"],
            "errors": {"error": row["errors"]} if row["errors"] else {},
            "latency_ms": {k: row[f"{k}_us"] / 1000 for k in ("p50", "p90", "p99")}}


def _perf_analyzer(binary: Path, venv: Path) -> dict[str, str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(
        venv / "lib/python3.11/site-packages/nvidia/cuda_runtime/lib")}
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
    cells = []
    for (server, proto, c), reports in runs.items():
        def med(f, reports=reports):  # type: ignore[no-untyped-def]
            return round(statistics.median(f(r) for r in reports), 4)
        cells.append({
            "server": server, "protocol": proto, "concurrency": c, "runs": len(reports),
            "rps": med(lambda r: r["throughput_rps"]),
            "p50_ms": med(lambda r: r["latency_ms"]["p50"]),
            "p90_ms": med(lambda r: r["latency_ms"]["p90"]),
            "p99_ms": med(lambda r: r["latency_ms"]["p99"]),
            "server_cpu_us_per_req": med(lambda r: r["server_cpu_us_per_req"]),
            "errors": sum(sum(r["errors"].values()) for r in reports),
        })
    return cells


def _ratios(cells: list[dict]) -> dict[str, dict]:  # type: ignore[type-arg]
    def cell(server: str, proto: str, c: int) -> dict | None:  # type: ignore[type-arg]
        return next((x for x in cells if (x["server"], x["protocol"], x["concurrency"])
                     == (server, proto, c)), None)

    pairs = {
        "rest_json_c1_p50_vs_nginx": (("redline", "json", 1), ("nginx", "json", 1), "p50_ms"),
        "rest_json_c1_p99_vs_nginx": (("redline", "json", 1), ("nginx", "json", 1), "p99_ms"),
        "rest_json_c8_rps_vs_fastapi": (("redline", "json", 8), ("fastapi", "json", 8), "rps"),
        "rest_json_c8_rps_vs_raw_asgi": (("redline", "json", 8), ("raw_asgi", "json", 8), "rps"),
        "rest_json_c8_p99_vs_fastapi": (("redline", "json", 8), ("fastapi", "json", 8),
                                        "p99_ms"),
        "mlp_c32_rps_vs_fastapi": (("redline_mlp", "json", 32), ("fastapi_mlp", "json", 32),
                                   "rps"),
        "grpc_c8_rps_vs_raw_grpc": (("redline", "grpc", 8), ("raw_grpc", "grpc", 8), "rps"),
        "rest_json_c1_p50_vs_raw_asgi": (("redline", "json", 1), ("raw_asgi", "json", 1),
                                         "p50_ms"),
        "rest_json_c1_p50_raw_asgi_vs_nginx": (("raw_asgi", "json", 1), ("nginx", "json", 1),
                                               "p50_ms"),
    }
    out = {}
    for key, (a, b, metric) in pairs.items():
        ca, cb = cell(*a), cell(*b)
        if not ca or not cb or not cb[metric]:
            continue
        ratio = round(ca[metric] / cb[metric], 3)
        entry: dict[str, object] = {"ratio": ratio}
        if key in TARGETS:
            op, bound = TARGETS[key]
            entry["target"] = f"{op} {bound}"
            entry["met"] = ratio <= bound if op == "<=" else ratio >= bound
        out[key] = entry
    return out


def _markdown(result: dict) -> str:  # type: ignore[type-arg]
    lines = ["| server | protocol | c | req/s | p50 ms | p90 ms | p99 ms | server CPU µs/req | "
             "errors |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in sorted(result["cells"], key=lambda x: (x["concurrency"], x["protocol"],
                                                   x["server"])):
        lines.append(f"| {x['server']} | {x['protocol']} | {x['concurrency']} | {x['rps']:,.0f} "
                     f"| {x['p50_ms']:.3f} | {x['p90_ms']:.3f} | {x['p99_ms']:.3f} | "
                     f"{x['server_cpu_us_per_req']} | {x['errors']} |")
    lines += ["", "| ratio | measured | target | met |", "| --- | --- | --- | --- |"]
    for key, e in result["ratios"].items():
        met = {True: "yes", False: "**no**"}.get(e.get("met"), "-")  # type: ignore[arg-type]
        lines.append(f"| {key} | {e['ratio']} | {e.get('target', '-')} | {met} |")
    return "\n".join(lines)


_PREPARE = r"""
import sys, warnings
warnings.filterwarnings("ignore")
from pathlib import Path
import numpy as np
from sklearn.datasets import load_digits
from sklearn.neural_network import MLPClassifier
from skl2onnx import to_onnx
from redline.models import ModelRepository
rf, scratch = sys.argv[1], Path(sys.argv[2])
ModelRepository(scratch / "repo").add_onnx("rf", rf)
X, y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32)
mlp = MLPClassifier(hidden_layer_sizes=(1024, 1024, 1024), max_iter=3, random_state=0).fit(X, y)
onx = to_onnx(mlp, X[:1], options={id(mlp): {"zipmap": False}}, target_opset=17)
(scratch / "mlp.onnx").write_bytes(onx.SerializeToString())
np.save(scratch / "mlp.npy", X[:1])
ModelRepository(scratch / "mlprepo").add_onnx("rf", scratch / "mlp.onnx")
"""

if __name__ == "__main__":
    main()
