"""Ingest throughput of ONE process into Redis, and freshness at a paced rate.

    .venv/bin/python -m benchmarks.features.ingest_bench [--events 200000] [--rates 50000,25000]
        [--no-freshness]

* throughput: a stream pre-filled with N events is drained by one StreamConsumer (consumer
  group, exactly-once Lua apply + XACK per batch); events/s = N / drain time; against the raw
  write floor in the same run (a redis-py pipeline of plain HSETs, one per tile update).
* Kinesis: the same events put to a 4-shard stream of kinesalite (Kinesis's API, installed by
  tools/services.d; skipped when it is not there) are drained by one ``KinesisSource``
  (GetRecords, decode, exactly-once Lua apply with sequence-number marks, checkpoints), against
  its floor in the same run: boto3 GetRecords of the same records, decoded with orjson and
  discarded. kinesalite is a test double, not AWS: its rate is the ceiling a local run can show.
* freshness: a producer process XADDs at each of --rates events/s (event time = send time) while the
  consumer runs; freshness = time the batch became visible in Redis - event time, p50/p99.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import orjson
import redis

from benchmarks.features.common import forty_features, redis_floor, start_redis
from redline.features import (
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    agg_sum,
    count,
    distinct,
    mean,
    stddev,
)
from redline.features.ingest import StreamConsumer
from redline.features.ingest.core import settle_heap
from redline.features.online.redis import RedisStore


def one_view() -> FeatureDefinitions:
    card = Entity("card", "card_id")
    src = EventSource("tx", card, {"card_id": str, "x0": float, "merchant": str})
    return FeatureDefinitions.of([FeatureView("card", src, [
        count("1m"), agg_sum("x0", "1m"), count("1h"), mean("x0", "1h"), stddev("x0", "1h"),
        distinct("merchant", "1h")])])


def payload(i: int, ts: int) -> bytes:
    return orjson.dumps({"card_id": f"c{i % 10000}", "x0": (i % 977) / 7.0,
                         "x1": 1.0, "x2": 2.0, "x3": 3.0, "x4": 4.0,
                         "merchant": f"m{i % 313}", "ts": ts})


def fill(url: str, stream: str, n: int) -> None:
    c = redis.Redis.from_url(url)
    now = int(time.time() * 1000)
    for start in range(0, n, 5000):
        p = c.pipeline(transaction=False)
        for i in range(start, min(n, start + 5000)):
            p.xadd(stream, {"d": payload(i, now)})
        p.execute()


def produce(url: str, stream: str, rate: int, seconds: float) -> None:
    c = redis.Redis.from_url(url)
    tick = 0.01
    per_tick = max(1, int(rate * tick))
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < seconds:
        p = c.pipeline(transaction=False)
        now = int(time.time() * 1000)
        for _ in range(per_tick):
            p.xadd(stream, {"d": payload(i, now)})
            i += 1
        p.execute()
        sleep = t0 + (i / per_tick) * tick - time.perf_counter()
        if sleep > 0:
            time.sleep(sleep)


def drain(defs: FeatureDefinitions, url: str, stream: str, n: int, batch: int) -> float:
    cons = StreamConsumer(defs, RedisStore(url, timeout_ms=5000), stream=stream, group="g",
                          consumer="bench", batch=batch)
    settle_heap()  # as the ingest loop (``run_source``) does
    t0 = time.perf_counter()
    done = 0
    while done < n:
        done += cons.poll()
    done += cons.flush()
    return time.perf_counter() - t0


def kinesis(url: str, n: int, batch: int) -> dict[str, object]:
    """Kinesis throughput of one process (1 view) and its floor, on kinesalite; {} without it."""
    import os
    import tempfile
    from pathlib import Path

    from redline.features.ingest.kinesis import KinesisSource
    from tests.features.kinesalite import REGION, Kinesalite, available

    if available() is not None:
        return {}
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    server = Kinesalite(Path(tempfile.mkdtemp())).start()
    try:
        server.create_stream("bench", 4)
        client = server.client()
        now = int(time.time() * 1000)
        for start in range(0, n, 500):
            records = [{"Data": payload(i, now), "PartitionKey": f"c{i % 10000}"}
                       for i in range(start, min(n, start + 500))]
            while records:
                got = client.put_records(StreamName="bench", Records=records)
                records = [r for r, res in zip(records, got["Records"], strict=True)
                           if "ErrorCode" in res]
        # floor: every shard read to its end, each record decoded and dropped
        t0 = time.perf_counter()
        seen = 0
        for shard in client.list_shards(StreamName="bench")["Shards"]:
            it = client.get_shard_iterator(StreamName="bench", ShardId=shard["ShardId"],
                                           ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            while True:
                page = client.get_records(ShardIterator=it, Limit=batch)
                for r in page["Records"]:
                    orjson.loads(r["Data"])
                seen += len(page["Records"])
                if not page["Records"]:
                    break
                it = page["NextShardIterator"]
        floor = time.perf_counter() - t0
        src = KinesisSource(one_view(), RedisStore(url, timeout_ms=5000), stream="bench",
                            region=REGION, endpoint_url=server.endpoint, batch=batch)
        settle_heap()
        t0 = time.perf_counter()
        done = 0
        while done < n:
            done += src.poll()
        dt = time.perf_counter() - t0
        src.close()
        return {"floor_kinesis_get_records_decode": {"events": seen, "seconds": round(floor, 2),
                                                     "events_per_s": round(seen / floor)},
                "throughput_kinesis_1_view_6_features": {
                    "events": n, "seconds": round(dt, 2), "events_per_s": round(n / dt),
                    "vs_floor": round(floor / dt, 3)}}
    finally:
        server.kill()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rates", default="50000,25000", help="paced rates for freshness")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--no-freshness", action="store_true", help="throughput and floors only")
    ap.add_argument("--no-kinesis", action="store_true", help="leave the Kinesis source out")
    args = ap.parse_args()
    proc, url = start_redis()
    results: dict[str, object] = {}
    try:
        for name, defs in (("1_view_6_features", one_view()),
                           ("5_views_40_features", forty_features())):
            stream = f"bench:{name}"
            fill(url, stream, args.events)
            dt = drain(defs, url, stream, args.events, args.batch)
            ops = len(defs.views) and sum(len(v.layout().groups) for v in defs.views.values())
            floor = redis_floor(url, args.events, ops)
            results[f"floor_redis_pipeline_{name}"] = floor
            results[f"throughput_{name}"] = {"events": args.events, "seconds": round(dt, 2),
                                             "events_per_s": round(args.events / dt),
                                             "tile_updates_per_event": ops,
                                             "vs_floor": round(args.events / dt
                                                               / floor["events_per_s"], 3)}
        if not args.no_kinesis:
            results.update(kinesis(url, args.events, args.batch))
        # freshness at paced rates, single view
        for rate in [] if args.no_freshness else [int(r) for r in args.rates.split(",")]:
            stream = f"bench:fresh:{rate}"
            defs = one_view()
            cons = StreamConsumer(defs, RedisStore(url, timeout_ms=5000), stream=stream,
                                  group="g", consumer="bench", batch=args.batch, block_ms=5)
            prod = mp.get_context("spawn").Process(target=produce,
                                                   args=(url, stream, rate, args.seconds))
            prod.start()
            t0 = time.perf_counter()
            done = 0
            while prod.is_alive() or done < cons.client.xlen(stream):
                done += cons.poll()
                if time.perf_counter() - t0 > args.seconds + 30:
                    break
            done += cons.flush()
            prod.join()
            elapsed = time.perf_counter() - t0
            results[f"freshness_at_{rate}_per_s"] = {
                "events": done, "achieved_rate": round(done / elapsed),
                **cons.freshness.summary()}
        print(json.dumps(results, indent=1))
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
