"""redline's Python models and graphs against Triton, MLServer and Ray Serve, in one run.

Two workloads (``peer_apps/workload.py``), V2 REST JSON, one FP32 row of 16 per request:

- ``rowsum``: a Python model that does no work (``OUTPUT0`` = row sums of ``INPUT0``). redline's
  ``model.py`` beside redline's ONNX path of the same signature (``ReduceSum``), Triton's Python
  backend with and without its dynamic batcher, MLServer's custom runtime in its main process
  and with its default worker, Ray Serve (throughput-optimized, HAProxy ingress) with and
  without ``@serve.batch``; gRPC against Triton's gRPC endpoint beside it.
- ``graph``: a Python featurizer -> an MLP in ONNX -> a Python post-step. redline's
  ``graph.yaml``; Triton's ensemble of three Python models (the middle one runs the same ONNX
  file through onnxruntime), with and without the dynamic batcher on every step; Ray Serve's
  composition of three deployments.

Every server runs pinned to CPU 0 (one worker process for redline, one instance or replica per
model for the peers, MLServer's one worker), the load tool (``redline bench``'s, run in this
process) pinned to CPU 1. During one server's turn every other server's processes are paused
(SIGSTOP; ``--side-by-side`` leaves them running): idle, Ray's GCS, raylet and agents, Triton's
and MLServer's threads still woke on CPU 0 and cut into the measured server's few milliseconds,
which at 50 req/s, with a p99 bound of 5 ms, is the third slowest request. The
peers run from their own environments (``bash benchmarks/peers/setup.sh pytriton mlserver
ray-serve``, made on first use otherwise), each started with a tag in its environment and every
process carrying it stopped at the end (``benchmarks/peers/procs.py``). All servers are up at
once, paused when not measured; cells (target x concurrency 1 and 8) go round-robin for
``--rounds`` rounds, then an open-loop ladder of rates (each round), every target at each rate
until its p99 passes ``--p99-ms`` or it errs. Each cell records the server's CPU time per
request (every process of the server). The report takes each cell's median over rounds with its
lowest and highest round, and each ratio per round: a target is met when the median meets it,
and the JSON says in how many rounds it was.

    python benchmarks/models/python_compare.py --rounds 3 --duration 2 --out results.json
    python benchmarks/models/python_compare.py --peers none --rounds 1 --duration 0.5  # redline

``--peers`` picks among ``triton``, ``mlserver``, ``ray`` (default: all; ``none``: redline
alone); ``--workloads`` among ``rowsum``, ``graph``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent / "peer_apps"
sys.path.insert(0, str(ROOT))  # run as a script, the repository root may not be on the path
from benchmarks.models.peer_apps import triton_models, workload  # noqa: E402
from benchmarks.peers import envs  # noqa: E402
from benchmarks.peers import procs as peer_procs  # noqa: E402

PY = sys.executable
PEERS = ("triton", "mlserver", "ray")
PEER_ENVS = {"triton": "pytriton", "mlserver": "mlserver", "ray": "ray-serve"}
WORKLOADS = ("rowsum", "graph")
INPUT = f"INPUT0:FP32:1x{workload.WIDTH}"
RATES: dict[str, tuple[float, ...]] = {
    "rowsum": (100, 250, 500, 1000, 2000, 4000, 6000, 8000, 11000, 15000, 20000),
    "graph": (50, 100, 250, 500, 1000, 2000, 3000, 4500, 6000, 8000, 11000, 15000)}

# The targets, each a ratio of two cells of the same round (``best:`` the peer configuration with
# the higher median): name -> (workload, measured, reference, c, metric, op, bound)
TARGETS = {
    "rowsum_c8_rps_vs_onnx": ("rowsum", "redline", "redline_onnx", 8, "rps", ">=", 0.85),
    "rowsum_c8_rps_vs_triton": ("rowsum", "redline", "best:triton", 8, "rps", ">=", 2.5),
    "rowsum_c1_rps_vs_triton": ("rowsum", "redline", "best:triton", 1, "rps", ">=", 1.5),
    "rowsum_c8_p99_vs_triton": ("rowsum", "redline", "best:triton", 8, "p99", "<=", 1.0),
    "rowsum_c1_p99_vs_triton": ("rowsum", "redline", "best:triton", 1, "p99", "<=", 1.0),
    "rowsum_c8_rps_vs_mlserver": ("rowsum", "redline", "best:mlserver", 8, "rps", ">=", 8.0),
    "rowsum_c8_rps_vs_ray": ("rowsum", "redline", "best:ray", 8, "rps", ">=", 8.0),
    "rowsum_grpc_c8_rps_vs_triton": ("rowsum", "redline_grpc", "best:triton_grpc", 8, "rps",
                                     "", 0.0),
    "rowsum_grpc_c1_rps_vs_triton": ("rowsum", "redline_grpc", "best:triton_grpc", 1, "rps",
                                     "", 0.0),
    "graph_c8_rps_vs_triton": ("graph", "redline_graph", "best:triton_ensemble", 8, "rps", ">=",
                               4.0),
    "graph_c8_p99_vs_triton": ("graph", "redline_graph", "best:triton_ensemble", 8, "p99", "<=",
                               1.0),
    "graph_max_rate_vs_triton": ("graph", "redline_graph", "best:triton_ensemble", 0, "rate",
                                 ">=", 4.0),
    "graph_c8_rps_vs_ray": ("graph", "redline_graph", "ray_graph", 8, "rps", ">=", 50.0),
}


@dataclass
class Target:
    """One thing measured: a model of a server, over one protocol."""

    name: str         # e.g. triton_batched
    family: str       # the configurations a ``best:`` ratio picks among (triton, ray, ...)
    workload: str
    server: str       # the Server it runs on
    model: str
    protocol: str = "json"
    ladder: bool = True  # joins the open-loop ladder


class Server:
    """A server this run started: its process, tag (every process it starts carries it) and
    ports."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], tag: str, http: int,
                 grpc: int = 0) -> None:
        self.name, self.proc, self.tag, self.http, self.grpc = name, proc, tag, http, grpc

    def cpu_seconds(self) -> float:
        """CPU time of every live process of the server (its workers, stubs and replicas)."""
        total = 0.0
        for pid in {self.proc.pid, *peer_procs.tagged(self.tag)}:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(server: Server, probe: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            break
        try:
            if probe():
                return
        except OSError:
            pass
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise RuntimeError(f"{server.name} did not become ready in {timeout:.0f} s:\n{tail}")


def http_ok(port: int, path: str, body: bytes | None = None) -> bool:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=2) as r:
        return bool(r.status == 200)


def one_row_body() -> bytes:
    data = [float(i) for i in range(1, workload.WIDTH + 1)]
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                   "shape": [1, workload.WIDTH], "data": data}]}).encode()


def answer(port: int, model: str) -> dict[str, list[float]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{model}/infer",
                                 data=one_row_body(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        doc = json.loads(r.read())
    return {o["name"]: [float(v) for v in o["data"]] for o in doc["outputs"]}


# --------------------------------------------------------------------------- the servers
class Run:
    """The servers of one run, started in a scratch folder and stopped together."""

    def __init__(self, scratch: Path, pause: bool = True) -> None:
        self.scratch = scratch
        self.servers: dict[str, Server] = {}
        self.pause = pause
        # 0.5 s to settle after a pause: each cell also warms up before it is timed.
        self.turns = peer_procs.Turns({}, pause, settle_s=0.5)

    def turn(self, name: str) -> None:
        """``name``'s turn: every other server paused (SIGSTOP), ``name`` continued."""
        self.turns.take(name)

    def start(self, name: str, cmd: list[str], cwd: Path, http: int, grpc: int = 0,
              env: dict[str, str] | None = None) -> Server:
        tag = peer_procs.new_tag()
        log = open(self.scratch / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(["taskset", "-c", "0", *cmd], cwd=cwd, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=peer_procs.tagged_env(tag, {**os.environ, **(env or {})}))
        server = Server(name, proc, tag, http, grpc)
        self.servers[name] = server
        if self.pause:
            self.turns.tags[name] = tag
        return server

    def stop(self) -> None:
        self.turns.end()  # a stopped process does not act on SIGTERM until continued
        for server in self.servers.values():
            if server.proc.poll() is None:
                server.proc.send_signal(signal.SIGTERM)
        for server in self.servers.values():
            try:
                server.proc.wait(30)
            except subprocess.TimeoutExpired:
                server.proc.kill()
            peer_procs.stop_tagged(server.tag, grace_s=5)


def add_redline(run: Run, workloads: list[str], files: Path) -> list[Target]:
    """redline's models into a scratch repository, then ``redline serve`` with one worker."""
    repo = run.scratch / "redline-repo"
    subprocess.run([PY, "-c", _REDLINE_REPO, str(repo), str(files), ",".join(workloads)],
                   check=True, cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    http, grpc = free_port(), free_port()
    server = run.start("redline", [PY, "-m", "redline.cli", "serve", "--no-watch",
                                   "--repository", str(repo), "--http-port", str(http),
                                   "--grpc-port", str(grpc), "--log-level", "warning"],
                       ROOT, http, grpc, {"REDLINE_SCALING__WORKERS": "1"})
    wait_ready(server, lambda: http_ok(http, "/v2/health/ready"), 120,
               run.scratch / "redline.log")
    targets = []
    if "rowsum" in workloads:
        targets += [Target("redline", "redline", "rowsum", "redline", "rowsum"),
                    Target("redline_onnx", "redline_onnx", "rowsum", "redline", "rowsum_onnx"),
                    Target("redline_grpc", "redline_grpc", "rowsum", "redline", "rowsum",
                           "grpc", ladder=False)]
    if "graph" in workloads:
        targets.append(Target("redline_graph", "redline_graph", "graph", "redline", "graph"))
    return targets


def add_triton(run: Run, workloads: list[str], files: Path) -> list[Target]:
    python = envs.ensure("pytriton")
    repo = triton_models.write_repository(run.scratch / "triton-repo", files)
    http, grpc = free_port(), free_port()
    server = run.start("triton", [str(python), str(ROOT / "benchmarks/peers/pytriton/serve.py"),
                                  str(repo), "--http-port", str(http), "--grpc-port", str(grpc),
                                  "--run-dir", str(run.scratch / "triton-run")], ROOT, http, grpc)
    wait_ready(server, lambda: http_ok(http, "/v2/health/ready"), 180,
               run.scratch / "triton.log")
    targets = []
    if "rowsum" in workloads:
        for model in ("rowsum", "rowsum_batched"):
            suffix = model.removeprefix("rowsum")
            targets += [Target(f"triton{suffix}", "triton", "rowsum", "triton", model),
                        Target(f"triton{suffix}_grpc", "triton_grpc", "rowsum", "triton", model,
                               "grpc", ladder=False)]
    if "graph" in workloads:
        targets += [Target(f"triton_ensemble{m.removeprefix('graph')}", "triton_ensemble",
                           "graph", "triton", m) for m in ("graph", "graph_batched")]
    return targets


def add_mlserver(run: Run, workloads: list[str], files: Path) -> list[Target]:
    if "rowsum" not in workloads:
        return []
    python = envs.ensure("mlserver")
    targets = []
    for workers, name in ((0, "mlserver"), (1, "mlserver_worker")):
        folder = run.scratch / name
        http, grpc = free_port(), free_port()
        subprocess.run([str(python), str(APPS / "mlserver_rowsum.py"), str(folder), str(http),
                        str(grpc), str(workers)], check=True)
        server = run.start(name, [str(python.parent / "mlserver"), "start", "."], folder, http,
                           grpc)
        wait_ready(server, lambda http=http: http_ok(http, "/v2/models/rowsum/infer",
                                                     one_row_body()), 120,
                   run.scratch / f"{name}.log")
        targets.append(Target(name, "mlserver", "rowsum", name, "rowsum"))
    return targets


def add_ray(run: Run, workloads: list[str], files: Path, replicas: int) -> list[Target]:
    python = envs.ensure("ray-serve")
    http = free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="rl-ray-"))  # short: Ray's socket paths live here
    server = run.start("ray", [str(python), str(APPS / "ray_app.py"), "--graph-files",
                               str(files), "--port", str(http), "--replicas", str(replicas),
                               "--run-dir", str(run_dir)], ROOT, http)
    probe = "graph" if "graph" in workloads else "rowsum"
    try:
        wait_ready(server, lambda: http_ok(http, f"/v2/models/{probe}/infer", one_row_body()),
                   300, run.scratch / "ray.log")
    finally:
        run.scratch.joinpath("ray-run-dir").write_text(str(run_dir))
    targets = []
    if "rowsum" in workloads:
        targets += [Target("ray", "ray", "rowsum", "ray", "rowsum"),
                    Target("ray_batched", "ray", "rowsum", "ray", "rowsum_batched")]
    if "graph" in workloads:
        targets.append(Target("ray_graph", "ray_graph", "graph", "ray", "graph"))
    return targets


def check_answers(run: Run, targets: list[Target]) -> None:
    """Every REST target answers one row as numpy does, before anything is timed."""
    import numpy as np

    x = np.arange(1, workload.WIDTH + 1, dtype=np.float32)[None, :]
    want = {"rowsum": {"OUTPUT0": workload.rowsum(x)}, "graph": workload.reference(x)}
    for t in targets:
        if t.protocol != "json":
            continue
        got = answer(run.servers[t.server].http, t.model)
        for name, value in want[t.workload].items():
            if not np.allclose(np.ravel(got[name]), np.ravel(value), rtol=1e-4, atol=1e-5):
                raise RuntimeError(f"{t.name} answered {name}={got[name]}, not {value.tolist()}")


# --------------------------------------------------------------------------- measuring
def bench(run: Run, t: Target, duration: float, warmup: float, *, c: int = 1,
          rate: float = 0.0) -> dict | None:  # type: ignore[type-arg]
    """One cell with ``redline bench``'s load tool, run in this process (pinned to CPU 1 by
    ``main``): closed loop at ``c``, or open loop at ``rate``."""
    import numpy as np

    from redline.bench.runner import LoadSpec, run_load

    run.turn(t.server)
    server = run.servers[t.server]
    url = (f"127.0.0.1:{server.grpc}" if t.protocol == "grpc"
           else f"http://127.0.0.1:{server.http}")
    row = np.random.default_rng(0).standard_normal((1, workload.WIDTH)).astype(np.float32)
    spec = LoadSpec(url=url, model=t.model, protocol=t.protocol, rate=rate or None,
                    connections=64 if rate else c, duration_s=warmup, warmup_s=0.0,
                    inputs={"INPUT0": ("FP32", row)})
    try:
        run_load(spec)  # the warm-up, apart: the CPU times below cover the measured seconds
        spec.duration_s = duration
        before, client, started = server.cpu_seconds(), time.process_time(), time.monotonic()
        report = run_load(spec).to_dict()
        server_s, elapsed = server.cpu_seconds() - before, time.monotonic() - started
    except Exception as exc:  # noqa: BLE001 - a cell that fails is reported, the run goes on
        print(f"{t.name} c={c} rate={rate}: {exc}", file=sys.stderr)
        return None
    lat = report["latency_ms"]
    return {"rps": report["throughput_rps"], "p50": lat["p50"], "p90": lat["p90"],
            "p99": lat["p99"], "ok": report["ok"],
            "errors": sum(report["errors"].values()),
            "cpu_us": round(server_s * 1e6 / max(1, report["ok"]), 1),
            # the server's CPU time over the wall time: under 1, it waited for work or a core
            "server_cores": round(server_s / elapsed, 3),
            # the load tool's own CPU time per request: near its core's share, it is the limit
            "client_cpu_us": round((time.process_time() - client) * 1e6 / max(1, report["ok"]),
                                   1)}


def measure(run: Run, targets: list[Target], rounds: int, duration: float, warmup: float,
            ladder_duration: float, p99_ms: float,
            rates: dict[str, tuple[float, ...]]) -> dict:  # type: ignore[type-arg]
    """Closed loop c=1 and c=8 and the ladder, every round, every target in turn."""
    closed: dict[str, dict[int, list[dict]]] = {t.name: {1: [], 8: []} for t in targets}  # type: ignore[type-arg]
    ladders: dict[str, list[dict]] = {t.name: [] for t in targets}  # type: ignore[type-arg]
    for r in range(rounds):
        for c in (1, 8):
            for t in targets:
                got = bench(run, t, duration, warmup, c=c)
                if got is None:
                    continue
                closed[t.name][c].append({**got, "round": r})
                print(f"round {r + 1} {t.name:24s} {t.protocol:4s} c={c:<2d} {got['rps']:>8.0f} "
                      f"req/s  p50 {got['p50']:.3f}  p99 {got['p99']:.3f} ms  "
                      f"{got['cpu_us']:.0f} CPU µs/req on {got['server_cores']:.2f} cores "
                      f"(load tool {got['client_cpu_us']:.0f})",
                      flush=True)
        by_workload: dict[str, list[Target]] = {}
        for t in targets:
            if t.ladder:
                by_workload.setdefault(t.workload, []).append(t)
        for name, group in by_workload.items():
            alive = {t.name for t in group}
            top: dict[str, float] = {t.name: 0.0 for t in group}
            steps: dict[str, list] = {t.name: [] for t in group}  # type: ignore[type-arg]
            for rate in rates[name]:
                for t in group:
                    if t.name not in alive:
                        continue
                    got = bench(run, t, ladder_duration, 0.5, rate=rate)
                    ok = got is not None and got["p99"] <= p99_ms and not got["errors"]
                    steps[t.name].append({"rate": rate, **(got or {"failed": True})})
                    if ok:
                        top[t.name] = rate
                    else:
                        alive.discard(t.name)
                if not alive:
                    break
            for t in group:
                ladders[t.name].append({"round": r, "max_rate": top[t.name],
                                        "steps": steps[t.name]})
                print(f"round {r + 1} {t.name:24s} open loop: {top[t.name]:.0f} req/s with "
                      f"p99 <= {p99_ms:g} ms", flush=True)
    return {"closed": closed, "ladders": ladders}


def summarize(targets: list[Target], data: dict) -> list[dict]:  # type: ignore[type-arg]
    cells = []
    for t in targets:
        for c in (1, 8):
            runs = data["closed"][t.name][c]
            if not runs:
                continue

            def med(key: str, runs: list[dict] = runs) -> float:  # type: ignore[type-arg]
                return round(statistics.median(x[key] for x in runs), 4)
            cells.append({
                "target": t.name, "workload": t.workload, "protocol": t.protocol,
                "concurrency": c, "rounds": len(runs), "rps": med("rps"),
                "rps_min": round(min(x["rps"] for x in runs), 1),
                "rps_max": round(max(x["rps"] for x in runs), 1),
                "p50_ms": med("p50"), "p99_ms": med("p99"),
                "p99_ms_min": round(min(x["p99"] for x in runs), 4),
                "p99_ms_max": round(max(x["p99"] for x in runs), 4),
                "server_cpu_us_per_req": med("cpu_us"),
                "client_cpu_us_per_req": med("client_cpu_us"),
                "server_cores": med("server_cores"),
                "errors": sum(x["errors"] for x in runs),
                "max_rate_p99_ok": statistics.median(
                    x["max_rate"] for x in data["ladders"][t.name]) if
                data["ladders"][t.name] and t.ladder else None})
    return cells


def _per_round(data: dict, name: str, c: int, metric: str) -> dict[int, float]:  # type: ignore[type-arg]
    if metric == "rate":
        return {x["round"]: float(x["max_rate"]) for x in data["ladders"].get(name, [])}
    return {x["round"]: float(x[metric]) for x in data["closed"].get(name, {}).get(c, [])}


def _lowest_rates(data: dict, name: str) -> dict[int, float]:  # type: ignore[type-arg]
    """The lowest rate of ``name``'s ladder in each round."""
    return {x["round"]: float(x["steps"][0]["rate"]) for x in data["ladders"].get(name, [])
            if x["steps"]}


def ratios(targets: list[Target], data: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    """Each target ratio: of the medians, per round, and the peer configuration it was
    against (for ``best:``, the family's configuration with the higher median)."""
    families: dict[str, list[str]] = {}
    for t in targets:
        families.setdefault(t.family, []).append(t.name)
    out: dict[str, dict] = {}  # type: ignore[type-arg]
    for key, (_, mine, ref, c, metric, op, bound) in TARGETS.items():
        if ref.startswith("best:"):
            names = families.get(ref[5:], [])
            # the best configuration: the higher throughput (or rate), at that concurrency
            rank = "rps" if metric in ("rps", "p99") else metric

            def score(name: str, rank: str = rank, c: int = c) -> float:
                values = list(_per_round(data, name, c, rank).values())
                return statistics.median(values) if values else -1.0
            ref = max(names, key=score) if names else ""
        a, b = _per_round(data, mine, c, metric), _per_round(data, ref, c, metric)
        if not a or not b:
            continue
        ma, mb = statistics.median(a.values()), statistics.median(b.values())
        per = {r: a[r] / b[r] for r in a if b.get(r)}
        entry: dict[str, object] = {"against": ref, "mine": ma, "theirs": mb}
        bounds: dict[int, float] = {}
        if metric == "rate":
            # A round where the peer sustained none of the ladder's rates: its highest rate is
            # below the lowest tried, so mine over that rate is a lower bound of the ratio.
            lowest = _lowest_rates(data, ref)
            bounds = {r: a[r] / lowest[r] for r in a if not b.get(r) and a[r] and r in lowest}
            if bounds:
                per.update(bounds)
                entry["lower_bound"] = True
                entry["note"] = (f"{ref} sustained none of the ladder's rates in "
                                 f"{len(bounds)} of {len(a)} rounds (from "
                                 f"{min(lowest.values()):g} req/s up): there the ratio is at "
                                 f"least {mine}'s rate over the lowest rate tried")
        if not per:
            entry.update(ratio=None, note=(
                f"{ref} sustained none of the ladder's rates with the p99 bound"
                + (f" ({mine}: {ma:g} req/s)" if ma else f", nor did {mine}")))
            out[key] = entry
            continue
        # (with a bound among them, or no median of the peer's, the median of the rounds')
        ratio = statistics.median(per.values()) if bounds or not mb else ma / mb
        entry.update(ratio=round(ratio, 3), min=round(min(per.values()), 3),
                     max=round(max(per.values()), 3))
        if op:
            def meets(v: float, op: str = op, bound: float = bound) -> bool:
                return v >= bound if op == ">=" else v <= bound
            entry.update(target=f"{op} {bound}", met=meets(ratio),
                         rounds_met=f"{sum(meets(v) for v in per.values())}/{len(per)}")
        out[key] = entry
    return out


def markdown(result: dict) -> str:  # type: ignore[type-arg]
    lines = ["| target | protocol | c | req/s (min–max) | p50 ms | p99 ms (min–max) | "
             "server CPU µs/req | open loop, p99 ≤ bound |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in result["cells"]:
        rate = x["max_rate_p99_ok"]
        lines.append(f"| {x['target']} | {x['protocol']} | {x['concurrency']} | "
                     f"{x['rps']:,.0f} ({x['rps_min']:,.0f}–{x['rps_max']:,.0f}) | "
                     f"{x['p50_ms']:.3f} | {x['p99_ms']:.3f} ({x['p99_ms_min']:.3f}–"
                     f"{x['p99_ms_max']:.3f}) | {x['server_cpu_us_per_req']} | "
                     f"{'—' if rate is None else f'{rate:,.0f}'} |")
    lines += ["", "| ratio | against | measured | min–max over rounds | target | met |",
              "| --- | --- | --- | --- | --- | --- |"]
    for key, e in result["ratios"].items():
        if e["ratio"] is None:
            lines.append(f"| {key} | {e['against']} | — | — | — | {e['note']} |")
            continue
        met = {True: "yes", False: "**no**"}.get(e.get("met"), "-")  # type: ignore[arg-type]
        at_least = "≥ " if e.get("lower_bound") else ""
        lines.append(f"| {key} | {e['against']} | {at_least}{e['ratio']} | "
                     f"{e['min']}–{e['max']} | "
                     f"{e.get('target', '-')} | {met} ({e.get('rounds_met', '-')}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:  # type: ignore[type-arg]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"comma-separated among {', '.join(PEERS)}, or none (default: all)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated among {', '.join(WORKLOADS)} (default: both)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per closed-loop cell")
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--ladder-duration", type=float, default=1.5,
                    help="seconds per open-loop rate")
    ap.add_argument("--p99-ms", type=float, default=5.0, help="the ladder's p99 bound")
    ap.add_argument("--rates", default="",
                    help="the ladder's rates, comma-separated, for every workload (default: "
                    + "; ".join(f"{w}: {','.join(map(str, r))}" for w, r in RATES.items())
                    + ")")
    ap.add_argument("--replicas", type=int, default=1,
                    help="Ray Serve's replicas per deployment: as many as redline's workers "
                    "(one: the servers share one core)")
    ap.add_argument("--side-by-side", action="store_true",
                    help="leave the servers not being measured running (default: paused, so "
                    "each is measured alone)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    args = ap.parse_args(argv)
    peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    workloads = [w for w in args.workloads.split(",") if w]
    for p in peers:
        if p not in PEERS:
            ap.error(f"unknown peer {p}: choose among {', '.join(PEERS)} or none")
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w}: choose among {', '.join(WORKLOADS)}")
    scratch = Path(tempfile.mkdtemp(prefix="redline-pycompare-"))
    run = Run(scratch, pause=not args.side_by_side)
    cpus = os.sched_getaffinity(0)
    try:
        files = scratch / "graph-files"
        workload.write_files(files)
        targets = add_redline(run, workloads, files)
        if "triton" in peers:
            targets += add_triton(run, workloads, files)
        if "mlserver" in peers:
            targets += add_mlserver(run, workloads, files)
        if "ray" in peers:
            targets += add_ray(run, workloads, files, args.replicas)
        check_answers(run, targets)
        os.sched_setaffinity(0, {1})  # the load tool runs here, on the other core
        time.sleep(2)  # let start-up work settle before anything is timed
        rates = ({w: tuple(float(r) for r in args.rates.split(",")) for w in workloads}
                 if args.rates else RATES)
        data = measure(run, targets, args.rounds, args.duration, args.warmup,
                       args.ladder_duration, args.p99_ms, rates)
        result = {"command": " ".join(["python", *sys.argv[0:1], *(argv or sys.argv[1:])]),
                  "rounds": args.rounds, "duration_s": args.duration,
                  "p99_bound_ms": args.p99_ms, "peers": peers, "workloads": workloads,
                  "alone": not args.side_by_side,
                  "cells": summarize(targets, data), "ratios": ratios(targets, data),
                  "runs": data}
        result["command"] = result["command"].replace(str(ROOT) + "/", "")
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
        print(markdown(result))
        return result
    finally:
        os.sched_setaffinity(0, cpus)
        run.stop()
        ray_dir = scratch / "ray-run-dir"
        if ray_dir.exists():
            shutil.rmtree(ray_dir.read_text(), ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


# redline's side: rowsum as model.py and as ONNX, and the three-step graph.yaml, whose Python
# steps are row-wise and so take ``batch: true`` (concurrent requests' rows in one call, as the
# peers' batched configurations do; 1.2-1.9x the throughput at c=8 of one call per request).
_REDLINE_REPO = r'''
import shutil, sys
from pathlib import Path
import numpy as np
from redline.models import ModelRepository
from benchmarks.models.peer_apps import workload

repo, files, wanted = ModelRepository(Path(sys.argv[1])), Path(sys.argv[2]), sys.argv[3]
here = Path(sys.argv[1]).parent
rows = np.random.default_rng(0).random((32, workload.WIDTH), dtype=np.float32)
if "rowsum" in wanted:
    (here / "rowsum").mkdir()
    (here / "rowsum" / "model.py").write_text(MODEL_PY)
    repo.add_python("rowsum", here / "rowsum" / "model.py", {"INPUT0": rows},
                    trust_code=True)
    repo.add_onnx("rowsum_onnx", workload.rowsum_onnx(here / "rowsum.onnx"))
if "graph" in wanted:
    folder = here / "graph"
    folder.mkdir()
    for name in (workload.CONSTANTS, workload.ONNX_FILE):
        shutil.copy(files / name, folder / name)
    shutil.copy(Path(workload.__file__), folder / "workload.py")
    (folder / "steps.py").write_text(STEPS_PY)
    (folder / "graph.yaml").write_text(GRAPH_YAML)
    repo.add_graph("graph", folder, trust_code=True, sample={"INPUT0": rows})
'''.replace("MODEL_PY", repr('''import numpy as np


class Model:
    inputs = {"INPUT0": ("FP32", [-1, 16])}
    outputs = {"OUTPUT0": ("FP32", [-1])}

    def predict(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"].sum(axis=1, dtype=np.float32)}
''')).replace("STEPS_PY", repr('''from pathlib import Path

from . import workload

_C = workload.load_constants(Path(__file__).resolve().parent)


def featurize(inputs):
    return {"FEATURES": workload.featurize(inputs["INPUT0"], _C["mean"], _C["scale"])}


def post(inputs):
    label, score = workload.post(inputs["PROBS"])
    return {"LABEL": label, "SCORE": score}
''')).replace("GRAPH_YAML", repr('''inputs:
  INPUT0: {datatype: FP32, shape: [-1, 16]}
steps:
  featurize:
    kind: python
    function: steps.py:featurize
    batch: true
    inputs: [INPUT0]
    outputs: {FEATURES: {datatype: FP32, shape: [-1, 16]}}
  mlp:
    kind: model
    model: mlp.onnx
    inputs: [featurize.FEATURES]
  post:
    kind: python
    function: steps.py:post
    batch: true
    inputs: [mlp.PROBS]
    outputs:
      LABEL: {datatype: INT64, shape: [-1]}
      SCORE: {datatype: FP32, shape: [-1]}
outputs:
  LABEL: post.LABEL
  SCORE: post.SCORE
'''))


if __name__ == "__main__":
    main()
