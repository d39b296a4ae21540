"""Read cost of 40 features in 5 views (cache off, random entities), with the Lua share.

    PYTHONPATH=src:. .venv/bin/python -m benchmarks.features.read_lua_share

p50/p99 of RedisReader.read for 1 and 10 entities and EVALSHA us/call (INFO commandstats).
"""

from __future__ import annotations

import random
import time

import redis

from benchmarks.features.common import events, forty_features, start_redis
from redline.features.ingest import Ingestor
from redline.features.online.redis import RedisStore


def main() -> None:
    proc, url = start_redis()
    try:
        views = list(forty_features().views.values())
        now = int(time.time() * 1000)
        evs = events(2000, 30, now)
        red = RedisStore(url, timeout_ms=1000)
        ing = Ingestor(forty_features(), red)
        for i in range(0, len(evs), 2000):
            ing.ingest(evs[i:i + 2000], now)
        c = redis.Redis.from_url(url)
        reader = red.reader(views, cache=False)
        rng = random.Random(0)
        for n in (1, 10):
            c.config_resetstat()
            samples = []
            for _ in range(1000):
                ids = [f"c{rng.randrange(2000)}" for _ in range(n)]
                t = time.perf_counter_ns()
                reader.read(ids)
                samples.append(time.perf_counter_ns() - t)
            lua = c.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
            samples.sort()
            print(f"{n} entities: p50 {samples[500] / 1000:.0f} us, p99 {samples[990] / 1000:.0f}"
                  f" us, Lua {lua:.0f} us/call")
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
