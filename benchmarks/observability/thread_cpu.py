"""Where a monitored server's extra CPU goes at capacity: each thread's CPU time per request,
monitoring on against off, in the turns ``capacity.py`` takes.

``capacity.py`` reads a server's CPU time as a whole (utime + stime, every thread). This reads
each thread's own from ``/proc/PID/task/TID/schedstat`` (nanoseconds on the CPU, nanoseconds
waiting on the run queue, and how many times it was put on a CPU) as often as ``capacity.py``
reads the whole while the client runs, and takes the client's measured window
(``window_unix``) as ``capacity.py`` does. Threads are named from a ``py-spy dump`` of each
server after the settle (``py-spy`` in the environment; without it, by thread id, the main
thread being the event loop's).

    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/thread_cpu.py --rounds 4 --otlp
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from benchmarks.observability.capacity import (
    CpuTrace,
    Server,
    answered,
    bench,
    bench_proc,
    quiesce,
    start,
)
from benchmarks.observability.overhead import Collector

Sample = dict[int, tuple[int, int, int]]  # tid -> (run ns, run-queue wait ns, timeslices)


def read_threads(pid: int) -> Sample:
    out: Sample = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run, wait, slices = (int(v) for v in (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue
        out[int(task.name)] = (run, wait, slices)
    return out


class ThreadTrace(CpuTrace):
    """Every thread's schedstat, sampled as ``CpuTrace`` samples the whole server's CPU."""

    def read(self, pid: int) -> Sample:
        return read_threads(pid)

    def at(self, when: float) -> dict[int, tuple[float, float, float]]:
        a, b, f = self.around(when)
        out = {}
        for tid, after in b.items():
            before = a.get(tid, (0, 0, 0))
            out[tid] = tuple(x + (y - x) * f for x, y in zip(before, after, strict=True))
        return out  # type: ignore[return-value]


def thread_names(pid: int) -> dict[int, str]:
    names = {pid: "MainThread"}
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return names
    for tid, name in re.findall(r'Thread (0x[0-9A-Fa-f]+|\d+) \(\w+\): "([^"]*)"', dump):
        if not tid.startswith("0x"):
            names[int(tid)] = name
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--apis", default="v1,v2")
    parser.add_argument("--otlp", action="store_true")
    parser.add_argument("--settle", type=float, default=30.0)
    args = parser.parse_args()
    apis = args.apis.split(",")
    otlp = None
    if args.otlp:
        collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
        threading.Thread(target=collector.serve_forever, daemon=True).start()
        otlp = f"http://127.0.0.1:{collector.server_port}/v1/traces"
    servers: dict[str, Server] = {"off": start(False), "on": start(True, otlp)}
    settle_until = time.monotonic() + args.settle
    while time.monotonic() < settle_until:
        for api in apis:
            for _, port in servers.values():
                bench(port, api, 2.0)
    names = {name: thread_names(proc.pid) for name, (proc, _) in servers.items()}
    # api -> server -> thread name -> [per-round (run µs/req, wait µs/req, slices/req)]
    per: dict[str, dict[str, dict[str, list[tuple[float, float, float]]]]] = {
        api: {name: {} for name in servers} for api in apis}
    rates: dict[str, dict[str, list[float]]] = {api: {name: [] for name in servers}
                                                for api in apis}
    try:
        order = list(servers)
        for r in range(args.rounds):
            turn = order[r % 2:] + order[:r % 2]
            for api in apis:
                for name in turn:
                    proc, port = servers[name]
                    quiesce(servers)
                    trace = ThreadTrace(proc.pid)
                    result = answered(bench_proc(port, api, args.seconds))
                    trace.stop()
                    begin, end = result["window_unix"]
                    a, b = trace.at(begin), trace.at(end)
                    ok = max(int(result["ok"]), 1)
                    rates[api][name].append(float(result["throughput_rps"]))
                    by_name: dict[str, list[float]] = {}
                    for tid, after in b.items():
                        before = a.get(tid, (0.0, 0.0, 0.0))
                        label = names[name].get(tid, "other")
                        acc = by_name.setdefault(label, [0.0, 0.0, 0.0])
                        for k in range(3):
                            acc[k] += after[k] - before[k]
                    for label, (run, wait, slices) in by_name.items():
                        per[api][name].setdefault(label, []).append(
                            (run / ok / 1e3, wait / ok / 1e3, slices / ok))
                    total = sum(v[0] for v in by_name.values()) / ok / 1e3
                    print(f"round {r + 1} {api} {name}: {result['throughput_rps']:,.0f} req/s, "
                          f"{total:.1f} µs CPU/req", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    for api in apis:
        print(f"\n{api}: medians over rounds, per request (run µs, run-queue wait µs, "
              "times put on a CPU)")
        for name in servers:
            print(f"  {name}: {statistics.median(rates[api][name]):,.0f} req/s")
            for label, values in sorted(per[api][name].items(),
                                        key=lambda kv: -statistics.median(v[0] for v in kv[1])):
                run = statistics.median(v[0] for v in values)
                wait = statistics.median(v[1] for v in values)
                slices = statistics.median(v[2] for v in values)
                print(f"    {label:32s} run {run:7.2f}  wait {wait:7.2f}  slices {slices:6.3f}")


if __name__ == "__main__":
    main()
