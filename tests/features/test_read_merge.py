"""The Redis read merges tiles with the one definition of a merge: its outputs equal, bit for bit,
``aggregates.NumericTile.merge`` folded over the same tile records in the same order (the order
HVALS returns them), for any events — huge, tiny, negative, tied, late — and any read time, from
the tiles and from the result cache. The read script writes the merge out in place (no Lua call),
so this holds that copy to ``aggregates`` as the property test holds ``PARTIALS``."""

from __future__ import annotations

import math
import struct

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redline.features import (
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    Ingestor,
    agg_max,
    agg_min,
    agg_sum,
    count,
    last,
    mean,
    stddev,
)
from redline.features.aggregates import LT, N, NumericTile, record_value
from redline.features.online.redis_lua import NUMERIC_TILE_BYTES
from redline.features.updates import view_tag

T0 = 1_767_225_600_000
CARD = Entity("card", "card_id")
TX = EventSource("tx", CARD, {"x": float, "y": float}, allowed_lateness="10m")
KINDS = [count("5m"), agg_sum("x", "5m"), mean("x", "5m"), stddev("x", "5m"),
         agg_min("x", "5m"), agg_max("x", "5m"), last("x", "5m"), agg_sum("x", "1m"),
         mean("x", "1m", default=-1.5)]
DEFS = FeatureDefinitions.of([
    FeatureView("a", TX, KINDS),
    FeatureView("b", TX, [count("1m"), agg_sum("y", "2m"), stddev("y", "2m"), last("y", "1m")]),
])
VIEWS = list(DEFS.views.values())

moderate = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False)
values = st.one_of(
    moderate, moderate, moderate,
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -1e308, 1e-300, 5e-324, 0.0, -0.0, 7.0, 1e16, 1.0]),
)
# (event time offset, arrival delay, x, y): equal times, tile-boundary times, late arrivals
event = st.tuples(st.sampled_from([0, 1, 4_999, 5_000, 29_999, 30_000, 59_999, 60_000, 61_000,
                                   119_999, 200_000, 299_999]),
                  st.sampled_from([0, 0, 0, 1, 500, 90_000]), values, values)


def _expected(client, key: str, now: int) -> list[float]:
    """Every view's outputs and newest event time, by folding ``NumericTile.merge`` over the
    key's records in HVALS order — what the read script must compute."""
    records = [struct.unpack("<13d", v) for v in client.hvals(key) if len(v) == NUMERIC_TILE_BYTES]
    outs: list[float] = []
    newest: list[float] = []
    for v in VIEWS:
        lay = v.layout()
        merged = []
        for w in lay.windows:
            lo, hi = w.window.covering(now)
            acc = NumericTile()
            for rec in records:
                if rec[0] == view_tag(v) + w.gid and lo <= rec[1] <= hi:
                    acc.merge(NumericTile(rec[2:]))
            merged.append(acc)
        outs += [record_value(merged[o.wid], o.kind, o.default) for o in lay.outputs]
        times = [m[LT] for m in merged if m[N] > 0]
        newest.append(max(times) if times else math.nan)
    return outs + newest


def _bits(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)


def _check(url: str, evs: list[tuple[int, int, float, float]], nows: list[int]) -> None:
    import redis

    from redline.features.online.redis import RedisStore

    store = RedisStore(url)
    client = redis.Redis.from_url(url)
    client.flushdb()
    ing = Ingestor(DEFS, store)
    for ts, delay, x, y in sorted(evs, key=lambda e: e[0] + e[1]):  # in arrival order
        ing.ingest([orjson.dumps({"card_id": "c1", "x": x, "y": y, "ts": T0 + ts})],
                   T0 + ts + delay)
    key = store.reader(VIEWS, cache=False).command(["c1"])[1][0]
    width = sum(len(v.layout().outputs) for v in VIEWS)
    for now in nows:
        want = _expected(client, key, now)
        for cache in (False, True, True):  # the second cached read comes from the result cache
            reader = store.reader(VIEWS, cache=cache)
            feats, missing, newest = reader.read_timed(["c1"], now, dtype=np.float64)
            got = [*feats[0].tolist(), *newest[0].tolist()]
            assert len(got) == width + len(VIEWS)
            assert missing.tolist() == [not evs]
            assert all(_bits(a, b) for a, b in zip(got, want, strict=True)), (cache, got, want)
    store.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(evs=st.lists(event, min_size=0, max_size=30), at=st.sampled_from([0, 5_000, 60_000,
                                                                            120_000, 290_000]))
def test_redis_read_equals_the_python_merge_of_its_tiles_bit_for_bit(redis_server_module, evs,
                                                                     at) -> None:  # type: ignore[no-untyped-def]
    _check(redis_server_module.url, evs, [T0 + 300_000 + at])


def test_a_long_stream_read_at_many_times_equals_the_python_merge(redis_server_module) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    ts = rng.integers(0, 600_000, 400)
    delay = rng.choice([0, 0, 0, 20, 45_000], 400)
    # magnitudes from 1e-3 to 1e15, so the compensated sums carry an error term
    xs = rng.standard_normal(400) * 10.0 ** rng.uniform(-3, 15, 400)
    ys = rng.lognormal(3.0, 2.0, 400)
    evs = [(int(a), int(b), float(x), float(y))
           for a, b, x, y in zip(ts, delay, xs, ys, strict=True)]
    _check(redis_server_module.url, evs, [T0 + t for t in range(300_000, 700_000, 37_000)])
