"""Shared pieces of the feature benchmarks: a private redis-server and the 5-view/40-feature set."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

import numpy as np
import redis

from redline.features import (
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    agg_max,
    agg_min,
    agg_sum,
    count,
    last,
    mean,
    stddev,
)


def start_redis(cpu: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
           "--dir", tempfile.mkdtemp(prefix="rl-bench-")]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    return proc, f"redis://127.0.0.1:{port}/0"


def forty_features() -> FeatureDefinitions:
    """5 views x 8 features, each computed from tiles: two windows (1 h on 5-min tiles, 5 min on
    10-s tiles) of one numeric field — the shape of the Feast peer's 5 views x 8 fields."""
    card = Entity("card", "card_id")
    src = EventSource("tx", card, {"card_id": str, **{f"x{v}": float for v in range(5)}},
                      allowed_lateness="1h")
    views = []
    for v in range(5):
        f = f"x{v}"
        views.append(FeatureView(f"fv{v}", src, [
            count("1h"), agg_sum(f, "1h"), mean(f, "1h"), stddev(f, "1h"), agg_min(f, "1h"),
            agg_max(f, "1h"), last(f, "1h"), agg_sum(f, "5m"),
        ]))
    return FeatureDefinitions.of(views)


def events(n_entities: int, per_entity: int, now_ms: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for e in range(n_entities):
        ts = now_ms - rng.integers(0, 3_000_000, per_entity)
        vals = rng.standard_normal((per_entity, 5))
        for i in range(per_entity):
            row = {"card_id": f"c{e}", "ts": int(ts[i])}
            for v in range(5):
                row[f"x{v}"] = float(vals[i, v])
            out.append(row)
    return out


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    arr = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"p50_us": round(float(p50), 1), "p90_us": round(float(p90), 1),
            "p99_us": round(float(p99), 1)}


def redis_floor(url: str, n: int, updates_per_event: int) -> dict[str, Any]:
    """The raw write floor: a redis-py pipeline of plain HSETs, one per tile update, with no
    decode, aggregation or exactly-once bookkeeping."""
    c = redis.Redis.from_url(url)
    value = b"x" * 104
    writes = n * updates_per_event
    t0 = time.perf_counter()
    for start in range(0, writes, 5000):
        p = c.pipeline(transaction=False)
        for i in range(start, min(writes, start + 5000)):
            p.hset(f"floor:{i % 10000}", str(i % 17), value)
        p.execute()
    dt = time.perf_counter() - t0
    return {"hset_per_s": round(writes / dt), "events_per_s": round(n / dt),
            "tile_updates_per_event": updates_per_event}
