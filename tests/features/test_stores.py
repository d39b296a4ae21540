"""Online stores against real redis-server processes: round trips, outages, cluster, TTLs."""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis

from redline.config import FeatureSettings
from redline.errors import StoreUnavailable
from redline.features import MemoryStore
from redline.features.ingest import Ingestor
from redline.features.online import open_online_store
from redline.features.online.redis import RedisStore
from tests.features.streams import T0, definitions, event_stream


def _five_views():
    from redline.features import (
        Entity,
        EventSource,
        FeatureDefinitions,
        FeatureView,
        agg_max,
        agg_sum,
        count,
        mean,
        stddev,
    )

    card = Entity("card", "card_id")
    src = EventSource("tx", card, {"card_id": str, "amount": float}, allowed_lateness="1h")
    views = [FeatureView(f"v{i}", src, [count("1h"), agg_sum("amount", "1h"),
                                        mean("amount", "1h"), agg_max("amount", "5m"),
                                        stddev("amount", "1h")]) for i in range(5)]
    return FeatureDefinitions.of(views)


def test_one_round_trip_for_five_views_and_ten_entities(redis_server) -> None:
    defs = _five_views()
    store = RedisStore(redis_server.url, timeout_ms=10_000)  # no timed-out call retried (busy CI)
    now = int(time.time() * 1000)
    events = [{"card_id": f"c{i % 10}", "amount": float(i), "ts": now - i} for i in range(200)]
    Ingestor(defs, store).ingest(events, now)
    reader = store.reader(list(defs.views.values()))
    client = redis.Redis.from_url(redis_server.url)
    client.config_resetstat()
    values, missing = reader.read([f"c{i}" for i in range(10)], now)
    stats = client.info("commandstats")
    calls = {k: v["calls"] for k, v in stats.items() if k != "cmdstat_config|resetstat"}
    # one round trip; inside Lua, per entity (one hash holds the five views of its source): a
    # cache probe, one HVALS of every view's tiles, the cache fill
    assert calls == {"cmdstat_evalsha": 1, "cmdstat_hmget": 10, "cmdstat_hvals": 10,
                     "cmdstat_hset": 10, "cmdstat_pexpire": 10}
    assert values.shape == (10, 25) and not missing.any()
    assert values[:, 0].sum() == 200  # v0:count_1h over all cards
    client.config_resetstat()
    again, _ = reader.read([f"c{i}" for i in range(10)], now)
    calls = {k: v["calls"] for k, v in client.info("commandstats").items()
             if k != "cmdstat_config|resetstat"}
    assert calls == {"cmdstat_evalsha": 1, "cmdstat_hmget": 10}  # cached: no tile merge
    assert (again == values).all()
    Ingestor(defs, store).ingest([{"card_id": "c3", "amount": 1000.0, "ts": now}], now)
    after, _ = reader.read([f"c{i}" for i in range(10)], now)
    assert after[3, 0] == values[3, 0] + 1 and after[3, 3] == 1000.0  # a write invalidates
    assert (after[[0, 1, 2, 4]] == values[[0, 1, 2, 4]]).all()
    later, _ = reader.read([f"c{i}" for i in range(10)], now + 3_600_000)
    assert later[:, 0].sum() == 0  # a new tile changes the signature: recomputed, not stale


def test_unreachable_redis_is_store_unavailable_and_recovers(redis_server) -> None:
    defs = definitions()
    store = RedisStore(redis_server.url, timeout_ms=200)
    reader = store.reader([defs.view("card_tx")])
    ing = Ingestor(defs, store)
    now = T0 + 10_000
    ing.ingest([{"card_id": "c1", "amount": 5.0, "merchant": "m", "n": 1, "ts": now}], now)
    redis_server.kill()
    with pytest.raises(StoreUnavailable, match="unavailable.*redis-server runs"):
        reader.read(["c1"], now)
    with pytest.raises(StoreUnavailable):
        ing.ingest([{"card_id": "c1", "amount": 5.0, "merchant": "m", "n": 1, "ts": now}], now)
    redis_server.restart()  # empty (no persistence) and without our scripts: NOSCRIPT reloads
    ing.ingest([{"card_id": "c1", "amount": 7.0, "merchant": "m", "n": 1, "ts": now}], now)
    values, missing = reader.read(["c1"], now, dtype=float)
    assert values[0][0] == 1 and not missing[0]


def test_factory_and_unknown_store() -> None:
    from redline.errors import ConfigError

    assert isinstance(open_online_store(FeatureSettings()), MemoryStore)
    with pytest.raises(ConfigError, match="memory' or 'redis'"):
        open_online_store(FeatureSettings(store="cassandra"))
    store = open_online_store(FeatureSettings(store="redis", redis_url="redis://127.0.0.1:1/0",
                                              redis_timeout_ms=100))
    with pytest.raises(StoreUnavailable, match="redis://127.0.0.1:1/0"):
        store.ping()


def test_keys_expire_after_window_and_lateness(redis_server) -> None:
    defs = definitions()
    store = RedisStore(redis_server.url)
    now = T0
    Ingestor(defs, store).ingest([{"card_id": "c9", "amount": 1.0, "merchant": "m", "n": 1,
                                   "ts": now}], now)
    client = redis.Redis.from_url(redis_server.url)
    (key,) = client.keys("rl*")
    view = defs.view("card_tx")
    assert key.decode() == "rl2:{card:c9}:tx"  # key schema 2: one hash per entity and source
    ttl = client.pttl(key)
    assert 0 < ttl <= max(v.layout().ttl_ms for v in defs.views.values()
                          if v.source.name == "tx")
    assert view.layout().ttl_ms >= 5 * 60_000 + view.source.lateness_ms


@pytest.mark.slow
def test_cluster_store_equals_memory(redis_cluster) -> None:
    defs = definitions()
    view = defs.view("card_tx")
    events = event_stream(11, n=600)
    mem, red = MemoryStore(), RedisStore(redis_cluster.url, cluster=True)
    for store in (mem, red):
        ing = Ingestor(defs, store)
        for i in range(0, len(events), 50):
            chunk = events[i:i + 50]
            ing.ingest([{k: v for k, v in e.items() if k != "_arrival_ms"} for e in chunk],
                       [e["_arrival_ms"] for e in chunk])
    now = events[-1]["_arrival_ms"]
    cards = [f"e{i}" for i in range(6)]
    a, ma = mem.reader([view]).read(cards, now, dtype=float)
    b, mb = red.reader([view]).read(cards, now, dtype=float)
    assert (ma == mb).all() and not ma.any()
    assert np.allclose(a, b, rtol=1e-9, equal_nan=True)
    # the entities really are spread over the shards, each entity's views on one shard
    slots = {red.client.keyslot(f"rl:{{card:{c}}}:x") for c in cards}
    nodes = {red.client.get_node_from_key(f"rl:{{card:{c}}}:x").port for c in cards}
    assert len(slots) == 6 and len(nodes) >= 2


def test_memory_cache_folds_writes_and_equals_a_fresh_merge() -> None:
    """Cached reads (updated in place by writes) agree with merging the tiles every time."""
    from redline.features.offline import isclose

    defs = definitions()
    view = defs.view("card_tx")
    events = event_stream(21, n=800)
    store = MemoryStore()
    cached, fresh = store.reader([view]), store.reader([view], cache=False)
    ing = Ingestor(defs, store)
    cards = [f"e{i}" for i in range(6)]
    folded = 0
    for i in range(0, len(events), 7):
        chunk = events[i:i + 7]
        now = chunk[-1]["_arrival_ms"]
        before = sum(store.data[k].cache_at is not None for k in store.data)
        ing.ingest([{k: v for k, v in e.items() if k != "_arrival_ms"} for e in chunk],
                   [e["_arrival_ms"] for e in chunk])
        folded += before
        a, ma = cached.read(cards, now, dtype=float)
        b, mb = fresh.read(cards, now, dtype=float)
        assert (ma == mb).all()
        assert a[:, 0].tolist() == b[:, 0].tolist()  # counts exactly
        assert all(isclose(float(x), float(y)) for x, y in zip(a.ravel(), b.ravel(), strict=True))
        cached.read(cards, now)  # leave valid caches for the next writes to fold into
    assert folded > 100
