"""Ingest metrics from a real ingest core: events, dead letters by reason, freshness."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redline.features import MemoryStore, load_definitions
from redline.features.ingest import Ingestor
from redline.monitoring.ingest import IngestMetrics
from tests.conftest import ingest_redis_stream

DEFS = Path(__file__).resolve().parents[1] / "features" / "defs_tx.py"


def test_ingest_stats_become_metrics() -> None:
    ingestor = Ingestor(load_definitions(DEFS), MemoryStore())
    metrics = IngestMetrics("http")
    now_ms = int(time.time() * 1000)
    good = [{"source": "transactions", "card_id": f"c{i}", "amount": 5.0, "merchant": "m",
             "ts": now_ms} for i in range(7)]
    ingestor.ingest(good + [{"source": "transactions", "card_id": "c1"}, b"{broken"])
    metrics.update(ingestor.stats())
    metrics.update(ingestor.stats())  # the same totals again add nothing
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
           for s in f.samples}
    assert got[("redline_ingest_events_total", (("source", "http"),))] == 7
    dead = {k[1]: v for k, v in got.items() if k[0] == "redline_ingest_dead_letters_total"}
    assert sum(dead.values()) == 2 and len(dead) >= 1
    fresh = got[("redline_ingest_freshness_seconds", (("quantile", "0.99"), ("source", "http")))]
    assert 0 <= fresh < 60


@pytest.mark.slow
def test_ingest_process_metrics_join_the_shared_scrape(redis_server, tmp_path: Path) -> None:
    """`redline ingest redis-stream` with the server's PROMETHEUS_MULTIPROC_DIR: a scrape of
    that directory (what any server worker's /metrics does) shows its events and dead letters."""
    import orjson
    import redis
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    root = Path(__file__).resolve().parents[2]
    client = redis.Redis.from_url(redis_server.url)
    now_ms = int(time.time() * 1000)
    for i in range(50):
        client.xadd("events", {"d": orjson.dumps({"card_id": f"c{i % 5}", "amount": 1.0,
                                                   "merchant": "m", "ts": now_ms})})
    client.xadd("events", {"d": b"{not json"})
    ingest_redis_stream(DEFS, redis_server.url, "events", 51, root,
                        {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in registry.collect() for s in f.samples}
    assert got[("redline_ingest_events_total", (("source", "events"),))] == 50
    assert sum(v for k, v in got.items() if k[0] == "redline_ingest_dead_letters_total") == 1


def _samples(registry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in registry.collect() for s in f.samples}


def test_redis_stream_consumer_lag_is_a_gauge(redis_server) -> None:
    """A consumer group behind by 30 of 40 entries reports lag 30, then 0 once drained."""
    import orjson

    from redline.features.ingest.redis_streams import StreamConsumer
    from redline.features.online.redis import RedisStore
    from redline.monitoring.ingest import MeteredSource

    store = RedisStore(redis_server.url, timeout_ms=10_000)
    now_ms = int(time.time() * 1000)
    for i in range(40):
        store.client.xadd("ev", {"d": orjson.dumps({"card_id": f"c{i % 5}", "amount": 1.0,
                                                    "merchant": "m", "ts": now_ms})})
    cons = StreamConsumer(load_definitions(DEFS), store, stream="ev", group="g", batch=10,
                          block_ms=10)
    metrics = IngestMetrics("ev")
    src = MeteredSource(cons, metrics)
    key = ("redline_ingest_consumer_lag",
           (("partition", "-"), ("source", "redis-stream"), ("stream_or_topic", "ev")))
    src.poll()  # reads 10 entries, then samples (the first poll always samples)
    assert _samples(metrics.registry)[key] == 30
    src.poll()  # within the second: no new sample, the gauge keeps its value
    assert _samples(metrics.registry)[key] == 30
    while src.poll():
        pass
    src.flush()  # a flush always samples
    assert _samples(metrics.registry)[key] == 0
    src.close()
