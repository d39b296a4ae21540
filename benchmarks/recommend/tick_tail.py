"""The recommender's open-loop tail with monitoring on and off: what the monitoring tick costs
the p99 at a rate well under capacity.

Each round starts a fresh Redis and ``redline serve`` of the example (as
``compare_ray_serve.py`` does), once with monitoring on and once off (the order alternates by
round), loads the same sessions, and sends each ``--rate`` open loop for ``--duration`` seconds
(latency counts from each request's due time: ``load.py``). Reported per mode and rate: the
median over rounds of p50, p99 and max, and how many requests took over ``--slow-ms``; and for
the slow ones, the server's own ``timings_us`` total (a server-side pause shows there; a
client-side one does not).

Why it exists: the tick (once a second) once held a worker's GIL 10-20 ms in one piece while
redis-py packed the ranker's candidate scores for the label join, argument by argument; every
request arriving meanwhile waited it out, and the p99 passed 20 ms at a third of capacity.

    python examples/recommend/generate.py --out examples/recommend/data  # once, with train.py
    PYTHONPATH=src:. python benchmarks/recommend/tick_tail.py \
        --artifacts examples/recommend/artifacts --data examples/recommend/data \
        --rate 600 --rate 900 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "examples" / "recommend"))
sys.path.insert(0, str(HERE.parents[1]))

from benchmarks.recommend import compare_ray_serve as rec  # noqa: E402
from benchmarks.recommend.load import frozen_heap, open_loop_answers  # noqa: E402


def run_mode(monitoring: bool, args: argparse.Namespace, data: object) -> dict[int, dict]:
    redis_proc, redis_url, redis_dir = rec.start_redis()
    server = None
    try:
        server = rec.start_redline(str(Path(args.artifacts).resolve()), redis_url, "recommend",
                                   args.workers, env={"REDLINE_MONITORING__ENABLED":
                                                      "true" if monitoring else "false"})
        bodies = [orjson.dumps(b) for b in rec.load_sessions(redis_url, server.url, data,
                                                             args.sessions)]
        url = f"{server.url}/v1/models/recommend/predict"

        def body(n: int) -> bytes:
            return bodies[n % len(bodies)]

        # Warm: connections, caches, and the drift calibration a fresh server runs at load.
        asyncio.run(open_loop_answers(url, body, min(args.rate), args.warmup))
        out = {}
        for rate in args.rate:
            with frozen_heap():  # the data held here, out of the collector's full passes
                answers = asyncio.run(open_loop_answers(url, body, rate, args.duration))
            latency = np.array([seconds for seconds, _ in answers]) * 1000
            server_ms = np.array([orjson.loads(answer).get("timings_us", {}).get("total", -1)
                                  / 1000 if answer else np.nan for _, answer in answers])
            slow = latency > args.slow_ms
            out[rate] = {"p50_ms": float(np.percentile(latency, 50)),
                         "p99_ms": float(np.percentile(latency, 99)),
                         "max_ms": float(latency.max()), "slow": int(slow.sum()),
                         "slow_server_ms_median": float(np.median(server_ms[slow]))
                         if slow.any() else None}
        return out
    finally:
        if server is not None:
            server.stop()
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(redis_dir, ignore_errors=True)


def main() -> None:
    from generate import read

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", required=True, help="what train.py wrote")
    ap.add_argument("--data", required=True, help="what generate.py wrote")
    ap.add_argument("--rate", type=int, action="append", default=None,
                    help="requests a second, open loop (repeatable; default 600)")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=8.0,
                    help="seconds of traffic at the lowest rate before the measured rates")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--slow-ms", type=float, default=20.0)
    args = ap.parse_args()
    args.rate = args.rate or [600]
    data = read(Path(args.data))
    rounds: dict[str, list[dict[int, dict]]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            rounds[mode].append(run_mode(mode == "on", args, data))
            print(f"round {r + 1} monitoring {mode}: {rounds[mode][-1]}", file=sys.stderr)
    report: dict = {"rates": args.rate, "rounds": args.rounds, "slow_ms": args.slow_ms}
    for mode, runs in rounds.items():
        report[mode] = {}
        for rate in args.rate:
            rows = [run[rate] for run in runs]
            report[mode][rate] = {
                key: round(statistics.median(row[key] for row in rows), 2)
                for key in ("p50_ms", "p99_ms", "max_ms", "slow")}
            report[mode][rate]["p99_ms_rounds"] = [round(row["p99_ms"], 2) for row in rows]
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


if __name__ == "__main__":
    main()
