"""Where the ``/v1`` tail at 500 req/s goes: who waits for a CPU, per interleaved slice.

``feast_compare.py`` measures the tail; this probe explains it. It serves the same workload
(``feast_compare.start_redline``: the Feast peer's 5 views x 8 features in Redis, its ONNX model)
and the do-nothing floor, runs open-loop slices against each in turn, and around every slice
reads the kernel's scheduler statistics (``/proc/<pid>/task/<tid>/schedstat``: time run, time
spent runnable but waiting for a CPU, timeslices) of the three parties of a request: the
server's threads, its redis-server and the load generator. ``--perf`` also records one slice per
variant with ``perf sched record`` and reports the distribution of each party's wake-up delay
(woken until running) and which task held the CPU while redis-server waited.

Variants (``--variants``, interleaved A B B A ... like ``feast_compare.py``):

* ``shared``  -- ``feast_compare.py``'s placement: servers on CPU 0, redis-server and the load
  generator on CPU 1.
* ``sut``     -- the system under test on one core: redis-server moved to CPU 0 beside the server
  (``taskset -p``, the same processes), the load generator alone on CPU 1.
* ``nospin``  -- ``shared``, but the load generator sleeps instead of spinning before each send
  (``LoadSpec.spin_s = 0``: up to ~1 ms late, charged to every server alike).
* ``yield``   -- ``shared``, the load generator spins but yields the CPU on every turn
  (``LoadSpec.spin_yield``).

``--timeline S`` then sends S seconds of open loop to redline alone keeping every request (its
latency and the answer's ``timings_us``); with ``--perf`` it records them with ``perf sched
record -k CLOCK_MONOTONIC`` (the generator's clock) and, for each of the slowest 1%, adds up how
long the server's loop thread and its redis-server were runnable but off CPU (and what ran
instead), how long the loop ran and how long the server's other threads ran (``attribute``).

Run it under the project's CPU lock; prints one JSON document.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import feast_compare as fc  # noqa: E402


def threads(pid: int) -> dict[int, str]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            pass
    return out


def schedstat(pid: int) -> dict[int, tuple[int, int, int]]:
    """tid -> (ns on CPU, ns runnable but waiting, timeslices)."""
    out = {}
    for tid in threads(pid):
        try:
            a, b, c = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[tid] = (int(a), int(b), int(c))
    return out


def by_thread(pid: int, before: dict, after: dict) -> dict[str, float]:
    """ms on CPU during the slice per thread name (the server's own threads)."""
    names = threads(pid)
    out: dict[str, float] = {}
    for tid, (a, _, _) in after.items():
        name = names.get(tid, "?")
        out[name] = round(out.get(name, 0.0) + (a - before.get(tid, (0, 0, 0))[0]) / 1e6, 2)
    return {k: v for k, v in out.items() if v > 0}


def delta(before: dict, after: dict) -> dict[str, float]:
    run = wait = slices = 0
    for tid, (a, b, c) in after.items():
        a0, b0, c0 = before.get(tid, (0, 0, 0))
        run, wait, slices = run + a - a0, wait + b - b0, slices + c - c0
    return {"run_ms": round(run / 1e6, 2), "wait_ms": round(wait / 1e6, 2), "slices": slices,
            "wait_per_slice_us": round(wait / 1e3 / slices, 1) if slices else 0.0}


def redis_cli(pid: int, *command: str) -> str:
    """One command to the redis-server ``pid`` (its port read from its process title,
    ``redis-server 127.0.0.1:PORT``)."""
    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    port = title.rsplit(":", 1)[1].split()[0]
    return subprocess.run(["redis-cli", "-p", port, *command], capture_output=True,
                          text=True).stdout.strip()


def perf_delays(data: Path, tids: dict[str, set[int]]) -> dict[str, Any]:
    """Wake-up delay distribution per party, and who ran on redis's CPU while it waited."""
    text = subprocess.run(["perf", "sched", "timehist", "-i", str(data), "-w"],
                          capture_output=True, text=True).stdout
    delays: dict[str, list[float]] = {k: [] for k in tids}
    runs: list[tuple[float, float, int, str]] = []  # (start s, end s, cpu, task)
    waits: list[tuple[str, float, float, int]] = []  # (party, from s, to s, cpu): delay > 500 us
    line_re = re.compile(r"^\s*([\d.]+)\s+\[(\d+)\]\s+(.+?)\[(\d+)(?:/(\d+))?\]\s+"
                         r"([\d.]+)\s+([\d.]+)\s+([\d.]+)")
    for line in text.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        tid = int(m.group(4))
        end, cpu, sch, run = float(m.group(1)), int(m.group(2)), float(m.group(7)), float(
            m.group(8))
        start = end - run / 1e3
        runs.append((start, end, cpu, m.group(3).strip()))
        for party, ids in tids.items():
            if tid in ids:
                delays[party].append(sch)
                if sch > 0.5:
                    waits.append((party, start - sch / 1e3, start, cpu))
    out: dict[str, Any] = {}
    for party, d in delays.items():
        if not d:
            continue
        a = np.array(d) * 1000.0  # us
        out[party] = {"wakeups": len(a), "p50_us": round(float(np.percentile(a, 50)), 1),
                      "p99_us": round(float(np.percentile(a, 99)), 1),
                      "max_us": round(float(a.max()), 1),
                      "over_500us": int((a > 500).sum()), "over_1ms": int((a > 1000).sum())}
    # Who held the CPU while a party waited more than 0.5 ms: ms of overlap per task name.
    held: dict[str, dict[str, float]] = {}
    for party, lo, hi, cpu in waits:
        per = held.setdefault(party, {})
        for start, end, c, task in runs:
            if c == cpu and end > lo and start < hi:
                per[task] = per.get(task, 0.0) + (min(end, hi) - max(start, lo)) * 1e3
    out["held_cpu_while_waiting_ms"] = {
        party: dict(sorted(((k, round(v, 2)) for k, v in per.items()),
                           key=lambda kv: -kv[1])[:8]) for party, per in held.items()}
    return out


async def timeline(target: Any, rate: float, duration_s: float) -> list[tuple[float, float, dict]]:
    """Open loop like ``redline.bench`` (timerfd send times, under ``fc.RT`` when set), keeping
    every request: (due, on the monotonic clock ``perf`` also uses; latency ms; the answer's
    ``timings_us``)."""
    import asyncio

    import orjson

    from redline.bench.clients import RestConnection, post_request

    host, port = target.url.split("://", 1)[1].split(":")
    path = target.path or f"/v1/models/{target.model}/predict"
    request = post_request(host, int(port), path, target.body,
                           {"content-type": "application/json"})
    free = [RestConnection(host, int(port), request) for _ in range(64)]
    for c in free:
        await c.open()
    out: list[tuple[float, float, dict]] = []

    async def one(conn: RestConnection, due: float) -> None:
        body = await conn.call()
        lat = (time.perf_counter() - due) * 1e3
        free.append(conn)
        doc = orjson.loads(body)
        out.append((due, lat, doc.get("timings_us", {}) if isinstance(doc, dict) else {}))

    from redline.bench.timer import PreciseTimer

    timer = PreciseTimer()
    start = time.perf_counter() + 0.1
    tasks = []
    old = os.sched_getscheduler(0), os.sched_getparam(0)
    if fc.RT:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(fc.RT["loadgen"]))
    try:
        for i in range(int(rate * duration_s)):
            due = start + i / rate
            await timer.until(due)
            tasks.append(asyncio.ensure_future(one(free.pop(), due)))
        await asyncio.gather(*tasks)
    finally:
        if fc.RT:
            os.sched_setscheduler(0, old[0], old[1])
        timer.close()
    for c in free:
        c.close()
    return sorted(out)


def explain(rows: list[tuple[float, float, dict]]) -> dict[str, Any]:
    """The slowest 1%: where their time went, and whether they come at a period."""
    lat = np.array([r[1] for r in rows])
    cut = np.percentile(lat, 99)
    slow = [r for r in rows if r[1] >= cut]
    stages: dict[str, list[float]] = {}
    for _, ms, t in slow:
        stages.setdefault("client_minus_server", []).append(ms * 1e3 - t.get("total", 0))
        for k, v in t.items():
            stages.setdefault(k, []).append(v)
    phase = np.array([(r[0] - rows[0][0]) % 1.0 for r in slow])
    return {"requests": len(rows), "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p99_ms": round(float(cut), 3),
            "slow_median_us": {k: round(float(np.median(v))) for k, v in stages.items()},
            "slow_phase_in_second_hist": np.histogram(phase, bins=10, range=(0, 1))[0].tolist(),
            "slow": [(round(d - rows[0][0], 4), round(ms, 3), t) for d, ms, t in slow]}


def timehist(data: Path) -> list[tuple[int, int, str, float, float, float]]:
    """perf sched timehist as (tid, cpu, task, woken s, running from s, running until s)."""
    text = subprocess.run(["perf", "sched", "timehist", "-i", str(data)],
                          capture_output=True, text=True).stdout
    line_re = re.compile(r"^\s*([\d.]+)\s+\[(\d+)\]\s+(.+?)\[(\d+)(?:/(\d+))?\]\s+"
                         r"([\d.]+)\s+([\d.]+)\s+([\d.]+)")
    out = []
    for line in text.splitlines():
        m = line_re.match(line)
        if m:
            end, run, sch = float(m.group(1)), float(m.group(8)) / 1e3, float(m.group(7)) / 1e3
            out.append((int(m.group(4)), int(m.group(2)), m.group(3).strip(), end - run - sch,
                        end - run, end))
    return out


def attribute(rows: list[tuple[float, float, dict]], events: list, server: set[int],
              loop_tid: int, redis: set[int]) -> dict[str, Any]:
    """For each of the slowest 1%: in its lifetime, how long the server's loop thread and its
    redis-server were runnable but not running (and who ran instead), how long the loop ran,
    and how long the server's other threads ran (they hold the GIL meanwhile)."""
    lat = np.array([r[1] for r in rows])
    cut = np.percentile(lat, 99)
    slow = [r for r in rows if r[1] >= cut]
    per: list[dict[str, float]] = []
    holders: dict[str, float] = {}
    by_cpu: dict[int, list] = {}
    for e in events:
        by_cpu.setdefault(e[1], []).append(e)
    for due, ms, _ in slow:
        lo, hi = due, due + ms / 1e3
        acc = {"loop_waited": 0.0, "redis_waited": 0.0, "loop_ran": 0.0, "other_threads_ran": 0.0}
        for tid, cpu, _task, woken, start, end in events:
            if end < lo or woken > hi:
                continue
            if tid == loop_tid or tid in redis:
                wait = max(0.0, min(start, hi) - max(woken, lo))
                acc["loop_waited" if tid == loop_tid else "redis_waited"] += wait
                if wait > 2e-4:  # who ran on that CPU meanwhile
                    for t2, _c, task2, _w, s2, e2 in by_cpu.get(cpu, []):
                        ov = min(e2, start, hi) - max(s2, woken, lo)
                        if ov > 0 and t2 != tid:
                            holders[task2] = holders.get(task2, 0.0) + ov
            ran = max(0.0, min(end, hi) - max(start, lo))
            if tid == loop_tid:
                acc["loop_ran"] += ran
            elif tid in server:
                acc["other_threads_ran"] += ran
        per.append({k: v * 1e3 for k, v in acc.items()})
    keys = ["loop_waited", "redis_waited", "loop_ran", "other_threads_ran"]
    # Each slow request's largest share names its cause (latency minus the four: the client,
    # the network stack, or time nobody on these two cores was accounted to).
    causes: dict[str, int] = {}
    for (_, ms, _), a in zip(slow, per, strict=True):
        rest = ms - sum(a[k] for k in keys)
        top = max([*keys, "rest"], key=lambda k: a.get(k, rest) if k != "rest" else rest)
        causes[top] = causes.get(top, 0) + 1
    return {"slow_requests": len(slow), "p99_ms": round(float(cut), 3),
            "median_ms": {k: round(float(np.median([a[k] for a in per])), 3) for k in keys},
            "mean_ms": {k: round(float(np.mean([a[k] for a in per])), 3) for k in keys},
            "largest_share": causes,
            "ran_instead_ms": dict(sorted(((k, round(v * 1e3, 1)) for k, v in holders.items()),
                                          key=lambda kv: -kv[1])[:10])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the Feast peer's model.onnx")
    parser.add_argument("--cards", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=6, help="slices per variant and target")
    parser.add_argument("--slice-s", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--variants", default="shared,sut")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="redline settings for the server (e.g. monitoring off)")
    parser.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE",
                        help="also serve a second redline (redline_b) with these settings")
    parser.add_argument("--perf", action="store_true", help="perf sched record one slice each")
    parser.add_argument("--no-floor", action="store_true")
    parser.add_argument("--timeline", type=float, default=0.0,
                        help="then this many seconds of open loop at --rate against redline "
                        "alone, every request kept: where the slowest 1%% spent their time")
    parser.add_argument("--sched", choices=("fifo", "none"), default="none",
                        help="as feast_compare.py --sched (fifo: servers, redis and the "
                        "generator SCHED_FIFO)")
    parser.add_argument("--idle-poll", action="store_true",
                        help="as feast_compare.py --idle-poll")
    args = parser.parse_args()
    args.no_monitoring = False
    fc.RT = dict(fc.RT_PRIORITIES) if args.sched == "fifo" else None
    qos = None
    if args.idle_poll:
        import struct

        qos = open("/dev/cpu_dma_latency", "wb", buffering=0)  # noqa: SIM115
        qos.write(struct.pack("i", 0))
    os.sched_setaffinity(0, {1})
    work = Path(tempfile.mkdtemp(prefix="redline-tail-probe-"))
    procs: list[subprocess.Popen] = []
    from redline.bench.runner import LoadSpec, run_load

    try:
        env = dict(kv.split("=", 1) for kv in args.env)
        target, _ = fc.start_redline(args, work, procs, env=env)
        # label -> (server pid, its redis-server pid or None)
        pid_of = {"redline": (procs[1].pid, procs[0].pid)}
        targets = [target]
        if args.b_env:
            b_env = dict(kv.split("=", 1) for kv in args.b_env)
            targets.append(fc.start_redline(args, work, procs, "redline_b", env=b_env)[0])
            pid_of["redline_b"] = (procs[-1].pid, procs[-2].pid)
        if not args.no_floor:
            targets.append(fc.start_floor(work, procs))
            pid_of["floor"] = (procs[-1].pid, None)
        redis_pids = [r for _, r in pid_of.values() if r]
        for pid in redis_pids:  # Redis's own view: events over 1 ms, commands over 0.5 ms
            redis_cli(pid, "CONFIG", "SET", "latency-monitor-threshold", "1")
            redis_cli(pid, "CONFIG", "SET", "slowlog-log-slower-than", "500")
            redis_cli(pid, "SLOWLOG", "RESET")
        variants = args.variants.split(",")
        slices: list[dict[str, Any]] = []
        perf_done: set[str] = set()
        perf_out: dict[str, Any] = {}
        order = [(v, t) for v in variants for t in targets]
        for r in range(args.rounds):
            for variant, t in (order if r % 2 == 0 else order[::-1]):
                cpu = "0" if variant == "sut" else "1"
                for redis_pid in redis_pids:
                    subprocess.run(["taskset", "-pc", cpu, str(redis_pid)], check=True,
                                   capture_output=True)
                pids = {"server": pid_of[t.label][0], "redis": pid_of[t.label][1] or redis_pids[0],
                        "loadgen": os.getpid()}
                before = {k: schedstat(p) for k, p in pids.items() if p}
                key = f"{variant}/{t.label}"
                rec = None
                if args.perf and key not in perf_done:
                    data = work / f"perf-{variant}-{t.label}.data"
                    rec = subprocess.Popen(["perf", "sched", "record", "-o", str(data)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(0.3)
                spec = LoadSpec(url=t.url, model=t.model, protocol="json",
                                duration_s=args.slice_s, warmup_s=0.5, v1_body=t.body,
                                path=t.path, rate=args.rate, connections=64)
                if variant == "nospin":
                    spec.spin_s = 0.0
                elif variant == "yield":
                    spec.spin_yield = True
                res = run_load(spec)
                if rec is not None:
                    rec.send_signal(2)
                    rec.wait(60)
                    perf_done.add(key)
                    tids = {k: set(threads(p)) for k, p in pids.items() if p}
                    perf_out[key] = perf_delays(data, tids)
                after = {k: schedstat(p) for k, p in pids.items() if p}
                slices.append({
                    "variant": variant, "target": t.label, "round": r,
                    "p50_ms": round(res.percentile_ms(50), 3),
                    "p99_ms": round(res.percentile_ms(99), 3), "ok": res.ok,
                    **{k: delta(before[k], after[k]) for k in before},
                    "server_threads_ms": by_thread(pids["server"], before["server"],
                                                   after["server"])})
                print(slices[-1], file=sys.stderr)
        summary: dict[str, Any] = {}
        for s in slices:
            summary.setdefault(f"{s['variant']}/{s['target']}", []).append(s)
        out = {"slices": slices, "perf": perf_out, "summary": {
            k: {"p99_ms_median": float(np.median([s["p99_ms"] for s in v])),
                "p99_ms": [s["p99_ms"] for s in v],
                "p50_ms_median": float(np.median([s["p50_ms"] for s in v])),
                "redis_wait_per_slice_us": float(np.median(
                    [s["redis"]["wait_per_slice_us"] for s in v]))}
            for k, v in summary.items()}}
        # Did redis-server itself ever take long? Events over 1 ms (LATENCY LATEST: empty if
        # none) and commands over 0.5 ms (the warm-up's first script call is one).
        out["redis_own"] = {label: {"latency_latest": redis_cli(r, "LATENCY", "LATEST"),
                                    "commands_over_500us": redis_cli(r, "SLOWLOG", "LEN")}
                            for label, (_, r) in pid_of.items() if r}
        if args.timeline:
            import uvloop

            rec = None
            if args.perf:
                data = work / "perf-timeline.data"
                rec = subprocess.Popen(["perf", "sched", "record", "-k", "CLOCK_MONOTONIC",
                                        "-o", str(data)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.3)
            rows = uvloop.run(timeline(target, args.rate, args.timeline))
            out["timeline"] = explain(rows)
            if rec is not None:
                rec.send_signal(2)
                rec.wait(120)
                server_pid, redis_pid = pid_of["redline"]
                out["timeline"]["attribution"] = attribute(
                    rows, timehist(data), set(threads(server_pid)), server_pid,
                    set(threads(redis_pid or 0)))
    finally:
        fc.stop_all(procs, work)
    import orjson

    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
