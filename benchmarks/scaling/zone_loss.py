"""The zone-loss drill, longer than the test's: two zones, each with a serving replica, a Redis
node (behind Sentinel) and a Kafka ingest consumer; zone A SIGKILLed whole under steady load
through ``redline.Client`` and HAProxy, then brought back (``tests/scaling/zonedrill.py``).

Per run: failed requests per path, degraded answers and until when, p99 before / during / after
the loss and once zone A is back, the time until zone B's Redis is promoted and until zone B
answers undegraded, and events lost or doubled (the store against a brute-force count).

    PYTHONPATH=src:. .venv/bin/python benchmarks/scaling/zone_loss.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tests.scaling.zonedrill import Timings, missing, run_drill

HERE = Path(__file__).parent


def table(runs: list[dict[str, Any]]) -> str:
    """The docs' table: the median over runs, the worst in brackets where it matters."""
    def med(get: Any) -> str:
        vals = [get(r) for r in runs if get(r) is not None]
        if not vals:
            return "–"
        return f"{statistics.median(vals):g}" + (f" ({max(vals):g})" if len(vals) > 1 else "")

    rows = [("failed requests, client / HAProxy",
             lambda r: r["client"]["failed"], lambda r: r["haproxy"]["failed"]),
            ("degraded answers, client / HAProxy",
             lambda r: r["client"]["degraded"], lambda r: r["haproxy"]["degraded"]),
            ("p99 ms before the loss", lambda r: r["client"]["p99_ms_before"],
             lambda r: r["haproxy"]["p99_ms_before"]),
            ("p99 ms while degraded", lambda r: r["client"]["p99_ms_during"],
             lambda r: r["haproxy"]["p99_ms_during"]),
            ("p99 ms after, zone B alone", lambda r: r["client"]["p99_ms_after"],
             lambda r: r["haproxy"]["p99_ms_after"]),
            ("p99 ms once zone A is back", lambda r: r["client"]["p99_ms_zone_a_back"],
             lambda r: r["haproxy"]["p99_ms_zone_a_back"])]
    lines = ["| | client | HAProxy |", "| --- | --- | --- |"]
    for name, c, h in rows:
        lines.append(f"| {name} | {med(c)} | {med(h)} |")
    lines += ["", "| | seconds or events |", "| --- | --- |"]
    for name, key in [("zone B's Redis promoted after", "redis_promoted_s"),
                      ("zone B answers undegraded after", "zone_b_undegraded_s"),
                      ("zone A ready again after its restart", "zone_a_back_to_ready_s"),
                      ("events sent", "events_sent"), ("events lost", "events_lost"),
                      ("events doubled", "events_doubled")]:
        lines.append(f"| {name} | {med(lambda r, k=key: r[k])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steady", type=float, default=10.0, help="seconds of load before")
    parser.add_argument("--lost", type=float, default=15.0, help="seconds zone A stays down")
    parser.add_argument("--back", type=float, default=10.0, help="seconds after zone A is back")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="/v1 requests a second on each path")
    parser.add_argument("--events", type=float, default=500.0, help="events a second")
    parser.add_argument("--out", type=Path, default=HERE / "results-zone-loss.json")
    args = parser.parse_args()
    why = missing()
    if why is not None:
        raise SystemExit(why)
    timings = Timings(steady=args.steady, lost=args.lost, back=args.back, rate=args.rate,
                      events=args.events)
    runs = []
    for i in range(args.runs):
        root = Path(tempfile.mkdtemp(prefix="redline-zone-loss-"))
        try:
            report = run_drill(root, timings)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        runs.append(report)
        print(f"run {i + 1}: {json.dumps(report)}", flush=True)
    args.out.write_text(json.dumps({"timings": vars(timings), "runs": runs}, indent=2) + "\n")
    print(table(runs))


if __name__ == "__main__":
    main()
