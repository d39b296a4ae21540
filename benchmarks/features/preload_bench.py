"""The demo's start-up preload: bulk (columnar) tile writes against event-by-event ones.

    PYTHONPATH=src:. .venv/bin/python -m benchmarks.features.preload_bench [--rounds 5]
        [--events .redline/demo/fraud-events.jsonl]

Needs ``.redline/demo`` (``make demo``). Each round replays ``fraud-events.jsonl`` into the demo
server's memory store as ``redline serve`` does (the cyclic collector paused), once per way, each
in a fresh process, the ways taking turns; prints the median events per CPU-second of each way
and their ratio (CPU time, so other processes on the cores matter less than to the clock).
Instructions, which the load does not change: ``valgrind --tool=cachegrind --cache-sim=no`` of
``--one bulk`` and ``--one each``, each less the same run with ``--events`` an empty file.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

CONFIG = ".redline/demo/redline.yaml"
EVENTS = ".redline/demo/fraud-events.jsonl"


def one(bulk: bool, events: str) -> float:
    """Events per CPU-second of one replay in this process."""
    from redline.assembly import build_server
    from redline.config import load_settings
    from redline.features.ingest import replay_file

    ingestor = build_server(load_settings(CONFIG)).pipeline.ingestor
    gc.disable()
    started = time.process_time()
    result = replay_file(ingestor, events, bulk=bulk)
    cpu_s = time.process_time() - started
    gc.enable()
    return result.accepted / max(cpu_s, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", default=EVENTS)
    # one replay in this process, one way (what each round runs; also for cachegrind)
    parser.add_argument("--one", choices=("bulk", "each"))
    args = parser.parse_args()
    if args.one:
        print(one(args.one == "bulk", args.events))
        return
    rates: dict[str, list[float]] = {"bulk": [], "each": []}
    for r in range(args.rounds):
        for way in (("bulk", "each") if r % 2 == 0 else ("each", "bulk")):
            out = subprocess.run([sys.executable, "-m", "benchmarks.features.preload_bench",
                                  "--one", way, "--events", args.events],
                                 check=True, capture_output=True, text=True)
            rates[way].append(float(out.stdout.split()[-1]))
    bulk, each = (statistics.median(rates[w]) for w in ("bulk", "each"))
    print(json.dumps({"rounds": args.rounds, "bulk_events_per_cpu_s": round(bulk),
                      "each_events_per_cpu_s": round(each), "ratio": round(bulk / each, 2)}))


if __name__ == "__main__":
    main()
