"""What a session item event and a read of a session's items cost in Redis, against the floor.

Interleaved rounds, each timing the same number of calls of four kinds on one connection:

* ``add``       -- ``RedisSessionStore.add_items`` of one event (the script: counters, LPUSH,
  LTRIM, three PEXPIREs, one round trip)
* ``add_floor`` -- a bare ``LPUSH`` of the same bytes (one round trip doing the least)
* ``items``     -- ``RedisSessionStore.items(sid, 20)`` (LRANGE and decoding 20 items)
* ``items_floor`` -- a bare ``LRANGE`` of the same 20 entries, not decoded

Prints one JSON document: p50/p99 in microseconds per kind and the ratios to the floors.
Usage: ``python -m benchmarks.pipeline.session_events --redis-url redis://127.0.0.1:6379/0``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from redline.features.online.redis import connect
from redline.serving.predict.sessions import RedisSessionStore, SessionItem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=500)
    args = ap.parse_args()
    client = connect(args.redis_url, timeout_ms=1000)
    store = RedisSessionStore(client, args.redis_url, 60.0, 20, 50)
    sid = f"bench-{time.monotonic_ns()}"
    item = SessionItem("i123", "click", 1_764_468_000_000)
    raw = item.encode()
    floor_key = f"rl:bench:{{{sid}}}:floor"
    store.add_items(sid, [item] * 20)
    client.rpush(floor_key, *([raw] * 20))
    kinds = {
        "add": lambda: store.add_items(sid, [item]),
        "add_floor": lambda: client.lpush(floor_key, raw),
        "items": lambda: store.items(sid, 20),
        "items_floor": lambda: client.lrange(floor_key, 0, 19),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
        for kind in order:
            fn = kinds[kind]
            for _ in range(args.calls):
                t0 = time.perf_counter()
                fn()
                times[kind].append(time.perf_counter() - t0)
    client.delete(*store.keys(sid), floor_key)
    out: dict[str, dict[str, float]] = {}
    for kind, ts in times.items():
        p50, p99 = np.percentile(np.asarray(ts) * 1e6, [50, 99])
        out[kind] = {"p50_us": round(float(p50), 1), "p99_us": round(float(p99), 1)}
    for kind in ("add", "items"):
        out[kind]["p50_vs_floor"] = round(out[kind]["p50_us"] / out[f"{kind}_floor"]["p50_us"], 2)
    print(json.dumps({"calls_per_kind": args.rounds * args.calls, **out}, indent=1))


if __name__ == "__main__":
    main()
