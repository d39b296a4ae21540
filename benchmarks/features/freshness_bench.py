"""Freshness — event produced to readable online — at 80 % of the highest sustained ingest rate,
through Redis Streams and through Kafka, one ingest process, one view, in one run.

    .venv/bin/python -m benchmarks.features.freshness_bench [--events 100000] [--seconds 8]

For each source: (1) the drain rate: a backlog of ``--events`` is drained by one consumer
(events/s); (2) a producer process sends at ``--load`` (default 0.8) of that rate for
``--seconds`` with event time = send time, while a fresh consumer group ingests — on a small
machine the producer's CPU is taken from ingest, and what the consumer achieves then is the
highest rate sustained *with* a producer; (3) the same at ``--load`` of that achieved rate.
Freshness is the time the event's batch became visible in Redis (after its write returned)
minus its event time, p50/p99/max over the last 65,536 events. Producer, consumer, Redis (and
the broker) share the machine, as they would on one host.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from typing import Any

from benchmarks.features.common import start_redis
from benchmarks.features.ingest_bench import fill, one_view, payload
from benchmarks.features.ingest_bench import produce as produce_stream
from benchmarks.features.kafka_bench import GROUP_CONF, create_topic, start_tansu
from benchmarks.features.kafka_bench import produce as produce_burst
from redline.features.ingest import StreamConsumer
from redline.features.ingest.core import settle_heap
from redline.features.online.redis import RedisStore


def produce_kafka(bootstrap: str, topic: str, rate: float, seconds: float) -> None:
    """``rate`` events/s for ``seconds``, event time = send time, in 5 ms ticks."""
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1,
                     "queue.buffering.max.messages": 2_000_000})
    tick = 0.005
    per_tick = max(1, int(rate * tick))
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < seconds:
        now = int(time.time() * 1000)
        for _ in range(per_tick):
            prod.produce(topic, key=f"c{i % 10000}".encode(), value=payload(i, now))
            i += 1
        prod.poll(0)
        sleep = t0 + (i / per_tick) * tick - time.perf_counter()
        if sleep > 0:
            time.sleep(sleep)
    prod.flush(60)


KAFKA_CONF: dict[str, Any] = {}  # --kafka-config: librdkafka settings over the source's own


def _kafka_source(url: str, bootstrap: str, topic: str, group: str, block_ms: int) -> Any:
    from redline.features.ingest.kafka import KafkaSource

    src = KafkaSource(one_view(), RedisStore(url, timeout_ms=10_000), topic=topic,
                      bootstrap=bootstrap, group=group, batch=1000, block_ms=block_ms,
                      config={**GROUP_CONF, **KAFKA_CONF})
    while not src.consumer.assignment():
        src.poll()
    return src


def _ingest_until_quiet(src: Any, quiet_s: float, proc: Any = None) -> tuple[int, float]:
    """Poll until the producer is done and nothing arrived for ``quiet_s``; (events, seconds
    from the first event to the last applied)."""
    settle_heap()  # as the ingest loop (``run_source``) does
    first = last = 0.0
    n = 0
    idle = time.perf_counter()
    while (proc is not None and proc.is_alive()) or time.perf_counter() - idle < quiet_s:
        got = src.poll()
        if got:
            now = time.perf_counter()
            first = first or now
            last = idle = now
            n += got
    n += src.flush()
    return n, (time.perf_counter() if not last else last) - first


def _paced(src: Any, target: Any, args: tuple[Any, ...], quiet_s: float) -> dict[str, Any]:
    src.freshness.samples.clear()
    proc = mp.get_context("spawn").Process(target=target, args=args)
    proc.start()
    n, dt = _ingest_until_quiet(src, quiet_s, proc)
    proc.join()
    return {"events": n, "achieved_per_s": round(n / dt) if dt else 0,
            **{k: round(v, 2) if isinstance(v, float) else v
               for k, v in src.freshness.summary().items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--sources", default="redis-stream,kafka")
    ap.add_argument("--kafka-config", default="{}",
                    help='JSON of librdkafka settings, e.g. \'{"fetch.wait.max.ms": 2}\'')
    args = ap.parse_args()
    KAFKA_CONF.update(json.loads(args.kafka_config))
    rproc, url = start_redis()
    results: dict[str, Any] = {}
    try:
        if "redis-stream" in args.sources:
            fill(url, "fr:max", args.events)
            cons = StreamConsumer(one_view(), RedisStore(url, timeout_ms=10_000),
                                  stream="fr:max", group="g", consumer="c", batch=1000,
                                  block_ms=5)
            n, dt = _ingest_until_quiet(cons, 1.0)
            top = n / dt
            rate = args.load * top
            cons = StreamConsumer(one_view(), RedisStore(url, timeout_ms=10_000),
                                  stream="fr:paced", group="g", consumer="c", batch=1000,
                                  block_ms=5)
            first = _paced(cons, produce_stream, (url, "fr:paced", int(rate), args.seconds), 1.0)
            rate2 = args.load * first["achieved_per_s"]
            cons = StreamConsumer(one_view(), RedisStore(url, timeout_ms=10_000),
                                  stream="fr:paced2", group="g", consumer="c", batch=1000,
                                  block_ms=5)
            results["redis_stream"] = {
                "drain_per_s": round(top), "offered_per_s": round(rate), **first,
                "at_load_of_achieved": {"offered_per_s": round(rate2), **_paced(
                    cons, produce_stream, (url, "fr:paced2", int(rate2), args.seconds), 1.0)}}
        if "kafka" in args.sources:
            kproc, bootstrap = start_tansu()
            try:
                create_topic(bootstrap, "fr-max")
                create_topic(bootstrap, "fr-paced")
                src = _kafka_source(url, bootstrap, "fr-max", "g1", 100)
                produce_burst(bootstrap, "fr-max", args.events, linger_ms=1)
                n, dt = _ingest_until_quiet(src, 3.0)
                src.close()
                top = n / dt
                rate = args.load * top
                src = _kafka_source(url, bootstrap, "fr-paced", "g2", 5)
                first = _paced(src, produce_kafka, (bootstrap, "fr-paced", rate, args.seconds),
                               3.0)
                src.close()
                create_topic(bootstrap, "fr-paced2")
                rate2 = args.load * first["achieved_per_s"]
                src = _kafka_source(url, bootstrap, "fr-paced2", "g3", 5)
                results["kafka"] = {
                    "drain_per_s": round(top), "offered_per_s": round(rate), **first,
                    "at_load_of_achieved": {"offered_per_s": round(rate2), **_paced(
                        src, produce_kafka, (bootstrap, "fr-paced2", rate2, args.seconds), 3.0)}}
                src.close()
            finally:
                kproc.kill()
        print(json.dumps(results, indent=1))
    finally:
        rproc.kill()


if __name__ == "__main__":
    main()
