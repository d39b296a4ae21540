"""The feature age at read: every store's read can also return, per view, the newest event time
of the tiles it merged (one double per view in the same reply), the same on memory and Redis,
from merged tiles and from the result cache."""

from __future__ import annotations

import math

import numpy as np
import orjson

from redline.features import (
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    Ingestor,
    MemoryStore,
    agg_sum,
    count,
    distinct,
    last,
)

T0 = 1_767_225_600_000
CARD = Entity("card", "card_id")
TX = EventSource("tx", CARD, {"amount": float, "merchant": str}, allowed_lateness="10m")
DEFS = FeatureDefinitions.of([
    FeatureView("a", TX, [count("1m"), agg_sum("amount", "5m"), last("amount", "5m")]),
    FeatureView("b", TX, [agg_sum("amount", "1m")]),
    FeatureView("d", TX, [distinct("merchant", "5m")]),  # no numeric tiles: no time
])
VIEWS = list(DEFS.views.values())


def _fill(store) -> None:
    ing = Ingestor(DEFS, store)
    events = [(T0 + 1_000, "c1"), (T0 + 70_000, "c1"), (T0 + 65_000, "c1"), (T0 + 5_000, "c2")]
    for ts, card in events:  # arrival = event time + 1 s
        ing.ingest([orjson.dumps({"card_id": card, "amount": 2.0, "merchant": "m", "ts": ts})],
                   ts + 1000)


def _check(readers) -> None:
    for reader in readers:
        now = T0 + 80_000
        for _ in range(2):  # the second read of the cached reader comes from the result cache
            feats, missing, newest = reader.read_timed(["c1", "c2", "nobody"], now,
                                                      dtype=np.float64)
            plain, plain_missing = reader.read(["c1", "c2", "nobody"], now, dtype=np.float64)
            assert np.array_equal(feats, plain, equal_nan=True)
            assert np.array_equal(missing, plain_missing)
            assert missing.tolist() == [False, False, True]
            assert newest.shape == (3, 3)
            assert newest[0, 0] == newest[0, 1] == T0 + 70_000  # c1's newest event
            assert newest[1, 0] == T0 + 5_000  # c2: in a's 5 m window ...
            assert math.isnan(newest[1, 1])  # ... but b's 1 m window has left it
            assert np.isnan(newest[:, 2]).all() and np.isnan(newest[2]).all()
        later = reader.read_timed(["c1"], T0 + 10 * 60_000, dtype=np.float64)[2]
        assert np.isnan(later).all()  # every tile left every window: no age to report


def test_newest_event_time_per_view_in_memory() -> None:
    store = MemoryStore()
    _fill(store)
    _check([store.reader(VIEWS), store.reader(VIEWS, cache=False)])


def test_newest_event_time_per_view_in_redis_equals_memory(redis_server) -> None:
    from redline.features.online.redis import RedisStore

    store = RedisStore(redis_server.url)
    _fill(store)
    _check([store.reader(VIEWS), store.reader(VIEWS, cache=False)])
    mem = MemoryStore()
    _fill(mem)
    for now in (T0 + 2_000, T0 + 66_000, T0 + 71_000, T0 + 200_000):
        red = store.reader(VIEWS).read_timed(["c1", "c2"], now, dtype=np.float64)
        loc = mem.reader(VIEWS).read_timed(["c1", "c2"], now, dtype=np.float64)
        for a, b in zip(red, loc, strict=True):
            assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), now
