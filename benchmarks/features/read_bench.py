"""Online read latency: 40 features over 5 views, 1 and 10 entities.

    .venv/bin/python benchmarks/features/read_bench.py [--entities 2000] [--calls 3000] [--pin]

Compared in the same run:
  floor       — redis-py pipeline of 5 HMGETs (9 fields each) per entity on precomputed hashes,
                exactly what Feast's Redis store sends (1 entity: 5 HMGETs; 10 entities: 50)
  redline-redis — RedisStore reader: one EVALSHA; "computed" merges every covering tile in Redis
                on every read (reader cache off, random entities), "cached" reads a hot set whose
                result cache (exact: dropped by any write or new tile) is valid
  redline-memory — MemoryStore reader, the same two cases
"""

from __future__ import annotations

import argparse
import json
import random
import time

import redis

from benchmarks.features.common import events, forty_features, percentiles, start_redis
from redline.features import MemoryStore
from redline.features.ingest import Ingestor
from redline.features.online.redis import RedisStore


def bench(fn, calls: int, warmup: int = 200) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
    return percentiles(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entities", type=int, default=2000)
    ap.add_argument("--per-entity", type=int, default=30)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--pin", action="store_true", help="redis on CPU 1, this process on CPU 0")
    args = ap.parse_args()
    if args.pin:
        import os

        os.sched_setaffinity(0, {0})
    proc, url = start_redis(1 if args.pin else None)
    try:
        defs = forty_features()
        views = list(defs.views.values())
        now = int(time.time() * 1000)
        evs = events(args.entities, args.per_entity, now)
        # a generous timeout: loading 2,000 entities can stall on a loaded machine
        red, mem = RedisStore(url, timeout_ms=10_000), MemoryStore()
        for store in (red, mem):
            ing = Ingestor(defs, store)
            for i in range(0, len(evs), 2000):
                ing.ingest(evs[i:i + 2000], now)
        client = redis.Redis.from_url(url)
        # the floor: Feast-shaped precomputed hashes, 5 per entity, 8 values + a timestamp each
        pipe = client.pipeline(transaction=False)
        for e in range(args.entities):
            for v in range(5):
                pipe.hset(f"floor:{e}:fv{v}", mapping={**{f"f{i}": b"\x00" * 12 for i in range(8)},
                                                        "_ts": b"\x00" * 12})
        pipe.execute()
        fields = [f"f{i}" for i in range(8)] + ["_ts"]
        rng = random.Random(0)

        def floor(n: int):
            def run() -> None:
                p = client.pipeline(transaction=False)
                for _ in range(n):
                    e = rng.randrange(args.entities)
                    for v in range(5):
                        p.hmget(f"floor:{e}:fv{v}", fields)
                p.execute()
            return run

        rr, mr = red.reader(views), mem.reader(views)
        rr_cold, mr_cold = red.reader(views, cache=False), mem.reader(views, cache=False)
        hot = max(1, args.entities // 20)  # reads of a hot set find their cached results valid

        def redline(reader, n: int, cached: bool = True):
            pool = hot if cached else args.entities

            def run() -> None:
                reader.read([f"c{rng.randrange(pool)}" for _ in range(n)])
            return run

        results = {}
        for n in (1, 10):
            results[f"floor_5hmget_x{n}"] = bench(floor(n), args.calls)
            results[f"redline_redis_computed_x{n}"] = bench(redline(rr_cold, n, cached=False),
                                                            args.calls)
            results[f"redline_redis_cached_x{n}"] = bench(redline(rr, n), args.calls)
            results[f"redline_memory_computed_x{n}"] = bench(redline(mr_cold, n, cached=False),
                                                             args.calls)
            results[f"redline_memory_cached_x{n}"] = bench(redline(mr, n), args.calls)
        for n in (1, 10):
            fl = results[f"floor_5hmget_x{n}"]
            for m in ("computed", "cached"):
                rd = results[f"redline_redis_{m}_x{n}"]
                results[f"ratio_redis_{m}_vs_floor_x{n}"] = {
                    k: round(rd[k] / fl[k], 2) for k in ("p50_us", "p99_us")}
                mm = results[f"redline_memory_{m}_x{n}"]
                results[f"speedup_memory_{m}_vs_redis_x{n}"] = {
                    k: round(rd[k] / mm[k], 1) for k in ("p50_us", "p99_us")}
        info = client.info("memory")
        keys = client.dbsize()
        results["redis_used_memory_mb"] = round(info["used_memory"] / 2**20, 1)
        results["redis_keys"] = keys
        mem_bytes = sum(client.memory_usage(k) or 0 for k in client.scan_iter("rl2:*", count=1000))
        results["redline_bytes_per_entity_5_views"] = round(mem_bytes / args.entities)
        print(json.dumps(results, indent=1))
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
