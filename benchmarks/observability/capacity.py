"""What monitoring costs at capacity: the demo's ``/v1`` and V2 REST at 8 clients (closed loop),
monitoring on against off, in alternating turns, with each server's CPU time per request.

``redline serve`` processes of the demo (``make demo`` first) run side by side: "off"
(``REDLINE_MONITORING__ENABLED=false``), "on" (monitoring as configured by default) and, with
``--traces-100``, "traces_100" (every request's spans exported). ``--otlp`` has the monitored
servers export their traces over OTLP to a local collector stand-in (at the default 1% head
sampling for "on"). ``redline bench`` drives one server at a time for ``--seconds``, the order
rotating every round so the machine's noise lands on each. Throughput at capacity is bounded by
CPU per request on a small machine, so the server's CPU microseconds per request (utime + stime
from /proc, every thread) is the steadier figure; both are reported per round against "off" in
the same round, with the median and range of the rounds' ratios.

Both figures cover the client's measured seconds only (``redline bench``'s ``window_unix``): the
server's CPU time is read every ``SAMPLE_S`` while a client runs and taken at the window's two
ends, so the client's start-up and warm-up -- seconds in which a monitored server is idle or
still warming, with the same fixed work as in steady state -- are not charged to the measured
requests. (Counting the client's whole life against its measured requests inflated both
servers' figures by about two thirds and the on/off ratio by whatever idle work "on" did.)
Each turn starts once every server is idle (``quiesce``): the previous turn's server may still
be exporting traces or folding its last second, on a core the next one needs.

Before measuring, every API is driven for ``--settle`` seconds: a new version's drift thresholds
for its predictions are calibrated once its first window of predictions fills (a one-off piece
of work that does not belong in a measurement of steady serving).

``--variant NAME:K=V`` adds a monitored server with settings of its own (environment variables;
an empty value unsets one), each against "off" in the same rounds: what one part of monitoring
costs, e.g. the trace export (``notrace:REDLINE_MONITORING__OTLP_ENDPOINT=``).

``--together`` drives the servers at once instead: on a busy machine the noise then lands on
all of them within the same seconds, each getting a share of what is left.

    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/capacity.py --rounds 8 --otlp
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.observability.overhead import Collector, wait_ready
from tests.conftest import free_port

DEMO = Path(".redline/demo")
Server = tuple[subprocess.Popen[bytes], int]
SAMPLE_S = 0.02  # how often a driven server's CPU time is read
IDLE_CORES = 0.05  # servers using less than this between turns are idle


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_env(monitoring: bool, otlp: str | None = None, trace_ratio: float | None = None,
               settings: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a server starts with: monitoring off, or on with the trace export at
    ``otlp`` and ``settings`` (a ``--variant``'s: an empty value unsets that variable)."""
    settings = settings or {}
    env = {**os.environ, **settings}
    if not monitoring:
        env["REDLINE_MONITORING__ENABLED"] = "false"
    if otlp and "REDLINE_MONITORING__OTLP_ENDPOINT" not in settings:
        env["REDLINE_MONITORING__OTLP_ENDPOINT"] = otlp
    if trace_ratio is not None:
        env["REDLINE_MONITORING__TRACE_SAMPLE_RATIO"] = str(trace_ratio)
    return {key: value for key, value in env.items() if value or key not in settings}


def variant(text: str) -> tuple[str, dict[str, str]]:
    """``--variant``'s value, ``NAME:K=V[,K=V]``, as (name, settings)."""
    name, _, rest = text.partition(":")
    pairs = [pair for pair in rest.split(",") if pair]
    if not name or not pairs or any("=" not in pair for pair in pairs):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME:K=V[,K=V], e.g. "
            "'notrace:REDLINE_MONITORING__OTLP_ENDPOINT=' (an empty value unsets it)")
    return name, dict(pair.split("=", 1) for pair in pairs)


def start(monitoring: bool, otlp: str | None = None, trace_ratio: float | None = None,
          settings: dict[str, str] | None = None) -> Server:
    port = free_port()
    env = server_env(monitoring, otlp, trace_ratio, settings)
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


def answered(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The client's JSON result (``ok``, ``throughput_rps``, ``window_unix``...)."""
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"redline bench failed with exit code {proc.returncode}")
    result: dict[str, Any] = json.loads(out)
    return result


def bench(port: int, api: str, seconds: float) -> None:
    answered(bench_proc(port, api, seconds))


class CpuTrace:
    """A server's CPU seconds read every ``SAMPLE_S`` on a thread, so the CPU spent between
    two wall-clock instants can be read afterwards (linear between two samples). A subclass
    reads something else with ``read`` (``thread_cpu.py``: every thread's)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, Any]] = [(time.time(), self.read(pid))]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self, pid: int) -> Any:
        return cpu_seconds(pid)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append((time.time(), self.read(self.pid)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), self.read(self.pid)))

    def around(self, when: float) -> tuple[Any, Any, float]:
        """The samples either side of ``when`` and how far between them it lies (0 to 1)."""
        times = [t for t, _ in self.samples]
        i = min(max(bisect.bisect_left(times, when), 1), len(times) - 1)
        (t0, before), (t1, after) = self.samples[i - 1], self.samples[i]
        return before, after, min(max((when - t0) / max(t1 - t0, 1e-9), 0.0), 1.0)

    def at(self, when: float) -> Any:
        before, after, f = self.around(when)
        return before + (after - before) * f


def quiesce(servers: dict[str, Server], most_s: float = 3.0) -> None:
    """Wait until every server is idle (together under ``IDLE_CORES`` over ``SAMPLE_S * 10``):
    the last turn's server may still be exporting its traces or folding its last second, and
    that work would take a core from the next turn's server."""
    pids = [proc.pid for proc, _ in servers.values()]
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        before = sum(cpu_seconds(pid) for pid in pids)
        time.sleep(SAMPLE_S * 10)
        if sum(cpu_seconds(pid) for pid in pids) - before < IDLE_CORES * SAMPLE_S * 10:
            return


def drive(servers: dict[str, Server], api: str, seconds: float
          ) -> dict[str, tuple[float, float]]:
    """The given servers driven at the same time: (req/s, server CPU µs a request) each, both
    over the client's measured seconds."""
    traces = {name: CpuTrace(proc.pid) for name, (proc, _) in servers.items()}
    clients = {name: bench_proc(port, api, seconds) for name, (_, port) in servers.items()}
    results = {name: answered(client) for name, client in clients.items()}
    out = {}
    for name, trace in traces.items():
        trace.stop()
        start, end = results[name]["window_unix"]
        cpu = trace.at(end) - trace.at(start)
        out[name] = (float(results[name]["throughput_rps"]),
                     cpu / max(int(results[name]["ok"]), 1) * 1e6)
    return out


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--apis", default="v1,v2")
    parser.add_argument("--otlp", action="store_true",
                        help="the monitored servers export traces over OTLP to a local "
                             "collector stand-in ('on' at the default head sampling)")
    parser.add_argument("--traces-100", action="store_true",
                        help="also a monitored server that keeps and exports every request's "
                             "spans (trace_sample_ratio 1.0; with --otlp)")
    parser.add_argument("--variant", action="append", default=[], type=variant,
                        metavar="NAME:K=V[,K=V]",
                        help="also a monitored server with these environment settings, to see "
                             "what one part costs, e.g. 'notrace:REDLINE_MONITORING__OTLP_"
                             "ENDPOINT=' (no trace export) or 'tick5:REDLINE_MONITORING__TICK_S=5'"
                             "; repeatable")
    parser.add_argument("--together", action="store_true",
                        help="drive the servers at once instead of in turns: on a busy machine "
                             "all of them then meet the same noise")
    parser.add_argument("--settle", type=float, default=45.0,
                        help="seconds of load (every API in turn) before measuring: drift "
                             "thresholds for predictions are calibrated once a window fills")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="write the rounds and their summary here as JSON")
    args = parser.parse_args()
    apis = args.apis.split(",")
    names = [name for name, _ in args.variant]
    for name in names:
        if name in ("off", "on", "traces_100") or names.count(name) > 1:
            parser.error(f"--variant {name}: that name is taken (off, on, traces_100, or "
                         "another variant); name it after what it changes, e.g. notrace")
    otlp = None
    if args.otlp or args.traces_100:
        collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
        threading.Thread(target=collector.serve_forever, daemon=True).start()
        otlp = f"http://127.0.0.1:{collector.server_port}/v1/traces"
    servers = {"off": start(False), "on": start(True, otlp)}
    if args.traces_100:
        servers["traces_100"] = start(True, otlp, trace_ratio=1.0)
    for name, settings in args.variant:
        servers[name] = start(True, otlp, settings=settings)
    settle_until = time.monotonic() + args.settle
    while time.monotonic() < settle_until:  # traffic fills the windows: calibrations happen now
        for api in apis:
            for _, port in servers.values():
                bench(port, api, 2.0)
    monitored = [name for name in servers if name != "off"]
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {api: [] for api in apis}
    try:
        names = list(servers)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]  # each first in turn
            for api in apis:
                if args.together:
                    quiesce(servers)
                    got = drive(servers, api, args.seconds)
                else:
                    got = {}
                    for name in order:
                        quiesce(servers)
                        got.update(drive({name: servers[name]}, api, args.seconds))
                rounds[api].append({name: {"rps": rps, "cpu_us": cpu}
                                    for name, (rps, cpu) in got.items()})
                off = got["off"]
                print(f"round {r + 1} {api}: " + "; ".join(
                    f"{name}: req/s on/off {got[name][0] / off[0]:.3f} ({got[name][0]:,.0f} vs "
                    f"{off[0]:,.0f}), CPU µs/req on/off {got[name][1] / off[1]:.3f} "
                    f"({got[name][1]:.0f} vs {off[1]:.0f})" for name in monitored), flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    load = os.getloadavg()[0]
    result: dict[str, object] = {"rounds": args.rounds, "seconds": args.seconds,
                                 "otlp": otlp is not None, "load_average": load, "apis": {}}
    for api, per_round in rounds.items():
        entry: dict[str, object] = {"rounds": per_round}
        for name in monitored:
            rate = [r[name]["rps"] / r["off"]["rps"] for r in per_round]
            cpu = [r[name]["cpu_us"] / r["off"]["cpu_us"] for r in per_round]
            entry[name] = {
                "rate_ratio": summary(rate), "cpu_ratio": summary(cpu),
                "rps": statistics.median(r[name]["rps"] for r in per_round),
                "cpu_us": statistics.median(r[name]["cpu_us"] for r in per_round)}
            print(f"{api} {name}: throughput on/off median {statistics.median(rate):.3f} "
                  f"[{min(rate):.3f}-{max(rate):.3f}], CPU per request on/off median "
                  f"{statistics.median(cpu):.3f} [{min(cpu):.3f}-{max(cpu):.3f}]; "
                  f"load average {load:.1f}")
        entry["off"] = {"rps": statistics.median(r["off"]["rps"] for r in per_round),
                        "cpu_us": statistics.median(r["off"]["cpu_us"] for r in per_round)}
        result["apis"][api] = entry  # type: ignore[index]
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
