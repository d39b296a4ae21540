"""What monitoring costs a request: V2 and /v1 latency and server CPU, four ways, interleaved.

Four servers with the same model run at once: monitoring off, metrics on (the default: metrics,
slow log, drift/quality windows), tracing at the default 1% head sampling (OTLP to a local
collector stand-in), and tracing at 100%. The client sends one request at a time over a
keep-alive connection (a raw socket: no client library in the measurement) and takes turns:
a short run against each server in a rotating order, for several rounds, so the machine's noise
(five other engineers share its two cores) hits each configuration alike. Servers are pinned to
CPU 0, the client and the collector to CPU 1.

Only the server being measured runs: the others are stopped (SIGSTOP) during its turn and
continued (SIGCONT) after, so one server's background work (its monitor's tick, drift
evaluation, span export) lands in its own latencies and never in another's. Each turn lasts
at least ``--requests`` requests per API and at least ``--min-seconds`` per API: the monitor
ticks once a second, so a turn that lasts a fraction of a second would catch the tick by luck
and the tail would be a lottery (and with the others running, their ticks would land in the
measured server's turns). ``--no-stop`` leaves them running (idle) instead,
to check that the stop and the catch-up after it are not what a difference is made of.

Reported per configuration and API: the median of the per-round p50s, the p99 over all rounds
(pooled) and the median, lowest and highest of the per-round p99s (how much the tail moves
between rounds), the pooled p99.9, the number of samples, and the server's CPU time per request
(utime + stime from /proc, the most stable figure on a busy machine). Ratios and differences are
against "off". A round-by-round table pairs each configuration with "off" in the same round (the
median over its processes) and gives the mean over rounds with a 95 % bootstrap interval: the
same configuration's p50 ratio moves by several percent between runs, so a bound such as +5 %
is resolved by a run only when the interval lies on one side of it. A last table repeats
the tail over the quiet turns only: those during which other processes used at most
``--quiet-share`` of the servers' core (CPU 0's busy time in
/proc/stat minus the measured server's own), since on a shared machine a neighbour's burst
moves a turn's p99 by milliseconds, far more than monitoring does.

**Idle cores.** This is a virtual machine whose idle CPU halts (``cpuidle`` ``haltpoll`` with no
guest polling): at concurrency 1 the server's core halts between two requests, and waking a
halted virtual CPU costs tens of microseconds, more than monitoring does, and by a varying
amount (the hypervisor's own polling adapts to how long the core stays idle). A server that does
more after each response keeps its core awake longer and wakes faster, which can give tracing
at 100% a *lower* p50 than "off". ``--awake qos`` (the default) holds
``/dev/cpu_dma_latency`` at 0 during the measured turns, the Linux PM QoS request latency tools
such as cyclictest make, so an idle CPU polls instead of halting and the p50 is the server's
work rather than the wake-up; ``--awake none`` measures with the halts included, and
``--awake both`` alternates the two in every round and reports both (needs root for the QoS
file; without it the run says so and measures with halts).

**Process luck.** Two processes of the same code differ by several percent at p50 (one run of
four identical tracing servers spread 87-103 µs): ``--replicas N`` serves each configuration
from N processes, all in the rotation, pooled.

``--before SRC`` adds "metrics" and "tracing_default" served from another source tree (say
an older commit's ``src``, from ``git worktree add``), in the same rotation: a before/after
comparison in one run.

**Bisecting.** ``--configs a,b,...`` runs named configurations instead of the four standard
ones ("off" always runs): the standard names and the diagnostic ones of ``DIAGNOSTICS``, each
monitoring with one part taken out by patching it in the server process (no records made, records
made and dropped, no fold, no drift/quality/review windows, no slow log, no tick, no trace export
thread, sampling 0, the collector disabled). ``--apis v2`` measures V2 only (half the turn).

    PYTHONPATH=src .venv/bin/python benchmarks/observability/overhead.py --rounds 12
    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/overhead.py --replicas 3 \
        --rounds 8 --requests 500 --min-seconds 0.6 --apis v2 \
        --configs metrics,metrics_no_observers,metrics_drop_records,metrics_no_fold
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.monitoring.served import make_repository  # noqa: E402

RUNNER = """
import json, sys
from redline.config import Settings
from redline.models import ModelRepository
from redline.assembly import run
cfg = json.loads(sys.argv[1])
s = Settings()
s.server.http_port = cfg["port"]
s.server.grpc_enabled = False
s.server.watch_repository = False
s.monitoring.enabled = cfg["monitoring"]
s.monitoring.otlp_endpoint = cfg.get("otlp")
s.monitoring.trace_sample_ratio = cfg.get("ratio", 0.01)
if "rows_per_s" in cfg:  # the windows' sampling rate (monitoring.window_rows_per_s)
    s.monitoring.window_rows_per_s = cfg["rows_per_s"]
if "fold_every" in cfg:  # records the feed folds at once, right after a response
    import redline.monitoring.monitor as _monitor
    _monitor.FOLD_EVERY = cfg["fold_every"]
for what in cfg.get("diag", ()):  # diagnostic configurations (DIAGNOSTICS): one part removed
    if what == "no_fold":  # records are made and fed, never folded into anything
        from redline.monitoring.monitor import ServerMonitor
        ServerMonitor.fold = lambda self, records: None
    elif what == "no_windows":  # folded into the metrics, slow log and traces, not the windows
        from redline.monitoring.windows import ModelWindows
        ModelWindows.fold = lambda self, records: None
    elif what == "no_metrics_fold":  # folded into the slow log, windows and traces only
        from redline.monitoring.metrics import RequestMetrics
        RequestMetrics.fold = lambda self, records: None
    elif what == "no_slowlog":
        from redline.monitoring.metrics import SlowLog
        SlowLog.fold = lambda self, records: None
    elif what == "no_tick":  # the tick task never ticks (the feed still folds every 16)
        import asyncio
        from redline.monitoring.monitor import ServerMonitor
        async def _never(self):
            await asyncio.Event().wait()
        ServerMonitor.run = _never
    elif what == "no_observers":  # the monitor runs (tick, routes), no request makes a record
        from redline.monitoring.monitor import ServerMonitor
        ServerMonitor.observers = lambda self: []
    elif what == "drop_records":  # records are made, their one observer drops them at once
        from redline.monitoring.monitor import ServerMonitor
        class _Drop:
            def request_finished(self, record):
                pass
        ServerMonitor.observers = lambda self: [_Drop()]
    elif what == "no_export_thread":  # the trace export thread exits at once
        from redline.monitoring.tracing import TraceExport
        TraceExport._run = lambda self: None
    elif what == "gc_off":  # the collector disabled once startup has frozen what it made
        import gc
        _freeze = gc.freeze
        def _freeze_and_disable():
            _freeze()
            gc.disable()
        gc.freeze = _freeze_and_disable
run(s, ModelRepository(cfg["repo"]))
"""

WARM_S = 2.0  # seconds of warm-up traffic per server (see the warm-up in main)

CONFIGS = {
    "off": {"monitoring": False},
    "metrics": {"monitoring": True},
    "tracing_default": {"monitoring": True, "ratio": 0.01, "otlp": True},
    "tracing_100": {"monitoring": True, "ratio": 1.0, "otlp": True},
}

# Diagnostic configurations (``--configs``): monitoring with one part taken out by patching it in
# the server process (RUNNER), to bisect what a configuration's cost is made of.
DIAGNOSTICS = {
    "off_gc_off": {"monitoring": False, "diag": ["gc_off"]},
    "metrics_no_fold": {"monitoring": True, "diag": ["no_fold"]},
    "metrics_no_windows": {"monitoring": True, "diag": ["no_windows"]},
    "metrics_no_slowlog": {"monitoring": True, "diag": ["no_slowlog"]},
    "metrics_no_metrics_fold": {"monitoring": True, "diag": ["no_metrics_fold"]},
    "metrics_no_tick": {"monitoring": True, "diag": ["no_tick"]},
    "metrics_gc_off": {"monitoring": True, "diag": ["gc_off"]},
    "metrics_no_observers": {"monitoring": True, "diag": ["no_observers"]},
    "metrics_drop_records": {"monitoring": True, "diag": ["drop_records"]},
    "records_only": {"monitoring": True, "diag": ["drop_records", "no_tick"]},
    "tracing_ratio0": {"monitoring": True, "ratio": 0.0, "otlp": True},
    "tracing_no_export_thread": {"monitoring": True, "ratio": 0.01, "otlp": True,
                                 "diag": ["no_export_thread"]},
    "tracing_gc_off": {"monitoring": True, "ratio": 0.01, "otlp": True, "diag": ["gc_off"]},
    "metrics_rows1000": {"monitoring": True, "rows_per_s": 1000.0},
    "metrics_rows250": {"monitoring": True, "rows_per_s": 250.0},
    "metrics_rows100": {"monitoring": True, "rows_per_s": 100.0},
    "tracing_rows250": {"monitoring": True, "ratio": 0.01, "otlp": True, "rows_per_s": 250.0},
    "tracing_rows100": {"monitoring": True, "ratio": 0.01, "otlp": True, "rows_per_s": 100.0},
    "tracing_fold1": {"monitoring": True, "ratio": 0.01, "otlp": True, "fold_every": 1},
    "metrics_fold1": {"monitoring": True, "fold_every": 1},
    "metrics_fold4": {"monitoring": True, "fold_every": 4},
    "metrics_fold64": {"monitoring": True, "fold_every": 64},
}


class Collector(BaseHTTPRequestHandler):
    """Stands in for an OTLP collector: accepts span batches and counts their bytes."""

    received = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        Collector.received += len(self.rfile.read(int(self.headers["content-length"])))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def http_request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


class Connection:
    """One keep-alive HTTP/1.1 connection; ``call`` returns the latency in microseconds."""

    reconnects = 0

    def __init__(self, port: int) -> None:
        self.port = port
        self.errors = 0
        self._connect()

    def _connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def call(self, request: bytes) -> float:
        tries = 0
        t0 = time.perf_counter_ns()
        self.sock.sendall(request)
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end >= 0:
                head = self.buf[:head_end].lower()
                i = head.find(b"content-length:")
                length = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0
                                  else None])
                if len(self.buf) >= head_end + 4 + length:
                    if not head.startswith(b"http/1.1 200"):
                        self.errors += 1  # a 504 under a noisy neighbour: counted, kept out
                        self.buf = self.buf[head_end + 4 + length:]
                        return -1.0
                    self.buf = self.buf[head_end + 4 + length:]
                    return (time.perf_counter_ns() - t0) / 1000.0
            chunk = self.sock.recv(65536)
            if not chunk:  # the server closed an idle keep-alive connection: once more
                Connection.reconnects += 1  # (a stopped server's connection idles past
                tries += 1                  # uvicorn's keep-alive timeout between its turns)
                if tries > 3:
                    raise RuntimeError("the server keeps closing the connection")
                self.sock.close()
                self._connect()
                t0 = time.perf_counter_ns()
                self.sock.sendall(request)
                continue
            self.buf += chunk


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu0_busy_seconds() -> float:
    """Busy time of CPU 0 (the servers' core) so far: user, nice, system, irq, softirq, steal."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu0 "):
            f = [int(v) for v in line.split()[1:]]
            return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / os.sysconf("SC_CLK_TCK")
    return 0.0


class Awake:
    """Keep idle CPUs from halting while held: a PM QoS request of 0 µs wake-up latency on
    ``/dev/cpu_dma_latency`` (the kernel keeps it while the file is open; root only)."""

    def __init__(self) -> None:
        self._file: object = None

    @staticmethod
    def available() -> bool:
        return os.access("/dev/cpu_dma_latency", os.W_OK)

    def hold(self) -> None:
        if self._file is None:
            f = open("/dev/cpu_dma_latency", "wb", buffering=0)  # noqa: SIM115 - held open
            f.write(struct.pack("i", 0))
            self._file = f

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # type: ignore[attr-defined]
            self._file = None


def wait_ready(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n")
                if b" 200 " in s.recv(1024):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server on port {port} did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=1000,
                    help="at least this many requests per API, server and round")
    ap.add_argument("--min-seconds", type=float, default=1.0,
                    help="and at least this long per API, server and round")
    ap.add_argument("--quiet-share", type=float, default=0.03,
                    help="a turn counts as quiet when other processes used at most this share "
                         "of the servers' core during it (/proc/stat); quiet turns' tails are "
                         "reported apart")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--before", default=None, metavar="SRC",
                    help="another source tree's src folder: its metrics and tracing_default "
                         "servers join the rotation (before/after in one run)")
    ap.add_argument("--twin-off", action="store_true",
                    help="a second 'off' server (off_twin): how far two identical processes' "
                         "p50 and p99 differ, the yardstick for every other difference")
    ap.add_argument("--replicas", type=int, default=1,
                    help="server processes per configuration, all in the rotation (pooled): "
                         "averages out how much one process differs from another")
    ap.add_argument("--awake", choices=("qos", "none", "both"), default="qos",
                    help="qos: idle CPUs poll instead of halting during the measured turns "
                         "(/dev/cpu_dma_latency = 0), so the p50 is the server's work, not a "
                         "virtual CPU's wake-up; none: as before; both: alternate, two tables")
    ap.add_argument("--configs", default=None,
                    help="comma-separated configurations to run instead of the four standard "
                         "ones ('off' is always run); names from CONFIGS and the diagnostic "
                         "ones: " + ", ".join(DIAGNOSTICS))
    ap.add_argument("--apis", default="v2,v1", help="which APIs each turn measures (v2,v1)")
    ap.add_argument("--no-stop", action="store_true",
                    help="leave the servers not being measured running (idle) instead of "
                         "stopping them: no catch-up at the start of a turn, but their idle "
                         "ticks run during other servers' turns")
    args = ap.parse_args()
    apis = [a for a in ("v2", "v1") if a in args.apis.split(",")]
    awake = Awake()
    modes = ["qos", "none"] if args.awake == "both" else [args.awake]
    if "qos" in modes and not awake.available():
        print("cannot write /dev/cpu_dma_latency (root only): measuring with halts",
              file=sys.stderr)
        modes = ["none"]
    configs = dict(CONFIGS)
    if args.configs:
        known = {**CONFIGS, **DIAGNOSTICS}
        names = ["off"] + [n for n in args.configs.split(",") if n and n != "off"]
        configs = {n: known[n] for n in names}
    if args.twin_off:
        configs["off_twin"] = dict(CONFIGS["off"])
    if args.before:
        configs["metrics_before"] = {**CONFIGS["metrics"], "src": args.before}
        configs["tracing_default_before"] = {**CONFIGS["tracing_default"], "src": args.before}
    pin = ["taskset", "-c", "0"] if subprocess.run(["which", "taskset"],
                                                   capture_output=True).returncode == 0 else []
    if pin:
        os.sched_setaffinity(0, {1})
    collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    otlp = f"http://127.0.0.1:{collector.server_port}/v1/traces"
    scratch = Path(tempfile.mkdtemp(prefix="redline-obs-"))
    make_repository(scratch / "repo")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, int] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    try:
        # Each configuration runs in --replicas processes (config.0, config.1, ...): two
        # processes of the same code differ by several percent at p50 (memory layout, hash seeds),
        # so one process per configuration compares processes as much as configurations.
        servers = {f"{name}.{r}": name for r in range(args.replicas) for name in configs}
        # All ports chosen while each is still held, so no two servers are given the same one.
        held = []
        for name in servers:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            ports[name] = int(sock.getsockname()[1])
        for sock in held:
            sock.close()
        for name, base in servers.items():
            cfg = configs[base]
            spec = {**cfg, "port": ports[name], "repo": str(scratch / "repo"),
                    "otlp": otlp if cfg.get("otlp") else None}
            src = cfg.get("src")
            run_env = env if src is None else {**env, "PYTHONPATH": str(Path(src).resolve())}
            procs[name] = subprocess.Popen([*pin, sys.executable, "-c", RUNNER, json.dumps(spec)],
                                           env=run_env,
                                           stderr=open(scratch / f"{name}.log", "wb"))
        for name in servers:
            wait_ready(ports[name])
        rng = np.random.default_rng(0)
        x = rng.normal(size=(64, 3)).astype(np.float32)
        v2 = [http_request("/v2/models/fraud/infer", json.dumps({"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": row.tolist()}]}).encode())
            for row in x]
        v1 = [http_request("/v1/models/fraud/predict", json.dumps({"request": {
            "amount": float(r[0]), "age": float(r[1]), "channel": int(abs(r[2]) * 2) % 3}})
            .encode()) for r in x]
        conns = {name: Connection(port) for name, port in ports.items()}
        # Warm-up, long enough for the monitors' first drift evaluation (tick 5: it calibrates
        # the thresholds once per version, a CPU burst), then again. Each server is sent
        # traffic for WARM_S: the windows sample ~1,000 requests a second, and the prediction
        # baseline is frozen after 1,000 sampled predictions, then calibrated at the next drift
        # evaluation (~0.1-0.3 s of CPU, once per version). With 300 requests a server it was
        # calibrated in the middle of the measured turns, beside the requests of one of them.
        for _ in range(2):
            for conn in conns.values():
                until = time.monotonic() + WARM_S
                i = 0
                while time.monotonic() < until or i < 300:
                    conn.call(v2[i % 64])
                    conn.call(v1[i % 64])
                    i += 1
            time.sleep(6)
        Key = tuple[str, str, str]  # (awake mode, config, api)
        lat: dict[Key, list[float]] = {(m, n, a): [] for m in modes for n in configs
                                       for a in apis}
        p50s: dict[Key, list[float]] = {k: [] for k in lat}
        p99s: dict[Key, list[float]] = {k: [] for k in lat}
        quiet: dict[Key, list[float]] = {k: [] for k in lat}
        quiet99: dict[Key, list[float]] = {k: [] for k in lat}
        cpu: dict[tuple[str, str], float] = {(m, n): 0.0 for m in modes for n in configs}
        calls: dict[tuple[str, str], int] = {(m, n): 0 for m in modes for n in configs}
        names = list(servers)
        stop = not args.no_stop
        if stop:
            for name in names:
                procs[name].send_signal(signal.SIGSTOP)
        turns = [(m, r) for r in range(args.rounds) for m in (modes if r % 2 else modes[::-1])]
        for mode, r in turns:
            order = names[r % len(names):] + names[: r % len(names)]
            if mode == "qos":
                awake.hold()
            for name in order:
                conn, pid = conns[name], procs[name].pid
                if stop:
                    procs[name].send_signal(signal.SIGCONT)
                    time.sleep(0.05)  # let it catch up on what came due while it was stopped
                c0 = cpu_seconds(pid)
                for api, reqs in (("v2", v2), ("v1", v1)):
                    if api not in apis:
                        continue
                    sample: list[float] = []
                    i = 0
                    t0, busy0, own0 = time.perf_counter(), cpu0_busy_seconds(), cpu_seconds(pid)
                    end = t0 + args.min_seconds
                    while i < args.requests or time.perf_counter() < end:
                        t = conn.call(reqs[i % 64])
                        i += 1
                        if t >= 0:
                            sample.append(t)
                    # What else ran on the server's core meanwhile (other people's work).
                    others = (cpu0_busy_seconds() - busy0) - (cpu_seconds(pid) - own0)
                    share = max(0.0, others) / (time.perf_counter() - t0)
                    calls[(mode, servers[name])] += i
                    key = (mode, servers[name], api)
                    lat[key].extend(sample)
                    p50s[key].append(float(np.percentile(sample, 50)))
                    p99s[key].append(float(np.percentile(sample, 99)))
                    if share <= args.quiet_share:
                        quiet[key].extend(sample)
                        quiet99[key].append(p99s[key][-1])
                cpu[(mode, servers[name])] += cpu_seconds(pid) - c0
                if stop:
                    procs[name].send_signal(signal.SIGSTOP)
            awake.release()
            print(f"round {r + 1}/{args.rounds} ({mode})", file=sys.stderr)
        for name in names:
            procs[name].send_signal(signal.SIGCONT)
        results: dict[str, dict[str, float]] = {}
        for (mode, name, api), values in lat.items():
            arr = np.asarray(values)
            k = (mode, name, api)
            rounds99 = p99s[k]
            results[f"{mode}/{name}/{api}"] = {
                "n": int(arr.size),
                "p50_us": round(float(np.percentile(arr, 50)), 1),
                "p99_us": round(float(np.percentile(arr, 99)), 1),
                "p999_us": round(float(np.percentile(arr, 99.9)), 1),
                "median_round_p50_us": round(statistics.median(p50s[k]), 1),
                "median_round_p99_us": round(statistics.median(rounds99), 1),
                "min_round_p99_us": round(min(rounds99), 1),
                "max_round_p99_us": round(max(rounds99), 1),
                "quiet_turns": len(quiet99[k]),
                "turns": len(rounds99),
                "quiet_p99_us": round(float(np.percentile(quiet[k], 99)), 1)
                if quiet[k] else float("nan"),
                "quiet_median_turn_p99_us": round(statistics.median(quiet99[k]), 1)
                if quiet99[k] else float("nan"),
                # per round, the median over the configuration's processes (for the intervals)
                "round_p50_us": per_round(p50s[k], args.rounds),
                "round_p99_us": per_round(rounds99, args.rounds),
            }
        for mode in modes:
            for name in configs:
                results[f"{mode}/{name}/cpu"] = {"server_cpu_us_per_request": round(
                    cpu[(mode, name)] / max(1, calls[(mode, name)]) * 1e6, 1),
                    "errors": sum(conns[n].errors for n, b in servers.items() if b == name)}
        for mode in modes:
            report(results, mode, configs, args.quiet_share)
        print(f"collector received {Collector.received:,} bytes of spans; "
              f"{Connection.reconnects} reconnects; server logs in {scratch}")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        awake.release()
        for proc in procs.values():
            proc.send_signal(signal.SIGCONT)  # a stopped process would not act on SIGTERM
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        collector.shutdown()


def per_round(turns: list[float], rounds: int) -> list[float]:
    """One value per round: the median of that round's turns (one per process of the
    configuration; each round appends its processes' turns together, in order)."""
    size = len(turns) // rounds if rounds else 0
    if not size:
        return []
    return [round(statistics.median(turns[i * size:(i + 1) * size]), 1) for i in range(rounds)]


def paired_interval(values: list[float], base: list[float], ratio: bool
                    ) -> tuple[float, float, float]:
    """(estimate, low, high): the mean over rounds of ``values`` against ``base`` in the same
    round (a ratio, as a geometric mean, or a difference), with the 95 % bootstrap interval
    over the rounds that the optimizer's figures carry (``optimize/uncertainty.py``). A p50
    ratio moves by several percent from run to run; the interval says whether a bound such as
    +5 % is resolved by this run."""
    from redline.optimize.uncertainty import MetricRows, Resamples, interval

    a, b = np.asarray(values, float), np.asarray(base, float)
    paired = np.log(a / b) if ratio else a - b
    span = interval(Resamples(paired.size, count=4000).replicates(MetricRows(per_row=paired)))
    est = float(paired.mean())
    if ratio:
        return float(np.exp(est)), float(np.exp(span.low)), float(np.exp(span.high))
    return est, span.low, span.high


def _rows(results: dict[str, dict[str, float]], configs: dict[str, dict]
          ) -> Iterator[tuple[str, str, dict[str, float], dict[str, float]]]:
    """Every (config, API, its results, "off"'s results) of one awake mode, V2 first."""
    for api in [a for a in ("v2", "v1") if f"off/{a}" in results]:
        off = results[f"off/{api}"]
        for name in configs:
            yield name, api, results[f"{name}/{api}"], off


def report(all_results: dict[str, dict[str, float]], mode: str, configs: dict[str, dict],
           quiet_share: float) -> None:
    """The tables of one awake mode."""
    results = {k.split("/", 1)[1]: v for k, v in all_results.items() if k.startswith(mode + "/")}
    print(f"\n## awake={mode} ("
          + ("idle CPUs poll: no wake-up from a halt in the latencies" if mode == "qos"
             else "idle CPUs halt: latencies include a virtual CPU's wake-up") + ")\n")
    print("| config | API | n | p50 µs (median of rounds) | p50 vs off | p99 µs (pooled) | "
          "p99 − off µs | p99 per round: median [min–max] µs | median p99 − off µs | "
          "p99.9 µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, api, r, off in _rows(results, configs):
        print(f"| {name} | {api} | {r['n']:,} | {r['median_round_p50_us']} | "
              f"{r['median_round_p50_us'] / off['median_round_p50_us']:.3f}x | "
              f"{r['p99_us']} | {r['p99_us'] - off['p99_us']:+.1f} | "
              f"{r['median_round_p99_us']} [{r['min_round_p99_us']}–"
              f"{r['max_round_p99_us']}] | "
              f"{r['median_round_p99_us'] - off['median_round_p99_us']:+.1f} | "
              f"{r['p999_us']} |")
    print("\nRound by round against \"off\" (each round's median over a configuration's "
          "processes; mean over rounds, 95 % bootstrap interval over rounds):\n")
    print("| config | API | p50 vs off | p99 − off µs |")
    print("|---|---|---|---|")
    for name, api, r, off in _rows(results, configs):
        if name == "off" or len(r["round_p50_us"]) < 2:
            continue
        p50 = paired_interval(r["round_p50_us"], off["round_p50_us"], ratio=True)
        p99 = paired_interval(r["round_p99_us"], off["round_p99_us"], ratio=False)
        print(f"| {name} | {api} | {p50[0]:.3f}x [{p50[1]:.3f}–{p50[2]:.3f}] | "
              f"{p99[0]:+.1f} [{p99[1]:+.1f} – {p99[2]:+.1f}] |")
    print(f"\nQuiet turns only (other processes used <= {quiet_share:.0%} of the servers' "
          "core during the turn):\n")
    print("| config | API | quiet turns | p99 µs (pooled) | p99 − off µs | median turn p99 µs "
          "| median turn p99 − off µs |")
    print("|---|---|---|---|---|---|---|")
    for name, api, r, off in _rows(results, configs):
        print(f"| {name} | {api} | {r['quiet_turns']}/{r['turns']} | {r['quiet_p99_us']} "
              f"| {r['quiet_p99_us'] - off['quiet_p99_us']:+.1f} | "
              f"{r['quiet_median_turn_p99_us']} | "
              f"{r['quiet_median_turn_p99_us'] - off['quiet_median_turn_p99_us']:+.1f} |")
    print("\nserver CPU per request (µs, both APIs; errors): " + ", ".join(
        f"{n} {results[f'{n}/cpu']['server_cpu_us_per_request']} "
        f"({results[f'{n}/cpu']['errors']})" for n in configs))


if __name__ == "__main__":
    main()
