"""Training equals serving on every input: one decoder, one merge, one tie rule, one value identity.

Each test holds one rule of that identity on the case that breaks it, and the last one is a
brute-force recomputation of every window over a generated stream with late, out-of-order,
duplicate, tied and malformed events, compared with every online path and the offline builder.
"""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest

from redline.features import (
    Entity,
    EventDecoder,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    Ingestor,
    MemoryStore,
    agg_max,
    agg_min,
    agg_sum,
    count,
    distinct,
    last,
    mean,
    stddev,
)
from redline.features.aggregates import HyperLogLog, hll_position, value_identity
from redline.features.ingest import replay_file
from redline.features.offline import EventLog, build_training_set, isclose, read_events

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a multiple of every tile size below
CARD = Entity("card", "card_id")
TX = EventSource("tx", CARD, {"amount": float, "merchant": str, "n": int, "flag": bool},
                 allowed_lateness="2m", max_clock_skew="1s")


def _view(name: str = "v", src: EventSource = TX) -> FeatureView:
    return FeatureView(name, src, [
        count("1m"), agg_sum("amount", "1m"), mean("amount", "5m"), agg_min("amount", "5m"),
        agg_max("amount", "5m"), last("amount", "5m"), stddev("amount", "5m"),
        distinct("merchant", "5m"), distinct("n", "5m"), distinct("flag", "5m"),
        agg_sum("n", "5m"),
    ])


DEFS = FeatureDefinitions.of([_view()])
VIEW = DEFS.view("v")
NAMES = VIEW.feature_names


def ev(ts: int, card: str = "c1", **kw: Any) -> dict[str, Any]:
    base = {"card_id": card, "amount": 1.0, "merchant": "m1", "n": 1, "flag": False, "ts": ts}
    return {**base, **kw}


def _online(events: list[dict[str, Any]], arrivals: list[int], store: Any = None,
            defs: FeatureDefinitions = DEFS, view: str = "v") -> Any:
    store = store or MemoryStore()
    ing = Ingestor(defs, store)
    for e, a in zip(events, arrivals, strict=True):  # one event per batch: arrival order
        ing.ingest([orjson.dumps(e)], a)
    return store.reader([defs.view(view)])


def _offline(events: list[dict[str, Any]], arrivals: list[int], card: str, t: int,
             defs: FeatureDefinitions = DEFS, view: str = "v") -> dict[str, float]:
    rows = [orjson.dumps({**e, "_arrival_ms": a}) for e, a in zip(events, arrivals, strict=True)]
    v = defs.view(view)
    refs = [v.ref(f) for f in v.feature_names]
    out = build_training_set(defs, EventLog(rows), pd.DataFrame({"card_id": [card], "ts": [t]}),
                             refs)
    return {f: float(out[v.ref(f)][0]) for f in v.feature_names}


def _read(reader: Any, card: str, t: int) -> dict[str, float]:
    vals, _ = reader.read([card], t, dtype=np.float64)
    return dict(zip(reader.plan.features and [f.split(":", 1)[1] for f in reader.plan.features],
                    vals[0].tolist(), strict=True))


def test_last_ties_on_event_time_go_to_the_later_arrival_offline_too() -> None:
    """Was: offline broke event-time ties by file row order, online by arrival."""
    events = [ev(T0 + 100, amount=7.0), ev(T0 + 100, amount=5.0)]
    arrivals = [T0 + 300, T0 + 200]  # the file lists the later arrival first
    t = T0 + 400
    online = _read(_online(list(reversed(events)), list(reversed(arrivals))), "c1", t)
    offline = _offline(events, arrivals, "c1", t)
    assert online["amount_last_5m"] == offline["amount_last_5m"] == 7.0


def test_last_does_not_depend_on_which_write_lands_last() -> None:
    """Was: on the stream path an entry claimed late overwrote a later arrival's ``last``."""
    a, b = ev(T0 + 100, amount=1.0), ev(T0 + 100, amount=2.0)
    same_arrival_1 = _read(_online([a, b], [T0 + 200, T0 + 200]), "c1", T0 + 300)
    same_arrival_2 = _read(_online([b, a], [T0 + 200, T0 + 200]), "c1", T0 + 300)
    assert same_arrival_1["amount_last_5m"] == same_arrival_2["amount_last_5m"]
    later_first = _read(_online([b, a], [T0 + 250, T0 + 200]), "c1", T0 + 300)
    assert later_first["amount_last_5m"] == 2.0  # applied first, but it arrived later


def test_last_tie_rule_holds_in_redis_whatever_the_write_order(redis_server) -> None:
    from redline.features.online.redis import RedisStore

    a, b = ev(T0 + 100, amount=1.0), ev(T0 + 100, amount=2.0)
    r1 = _read(_online([a, b], [T0 + 200] * 2, RedisStore(redis_server.url)), "c1", T0 + 300)
    RedisStore(redis_server.url).client.flushall()
    r2 = _read(_online([b, a], [T0 + 200] * 2, RedisStore(redis_server.url)), "c1", T0 + 300)
    mem = _read(_online([b, a], [T0 + 200] * 2), "c1", T0 + 300)
    assert r1["amount_last_5m"] == r2["amount_last_5m"] == mem["amount_last_5m"]


def test_distinct_of_an_int_field_is_the_same_online_and_offline() -> None:
    """Was: offline turned int columns into floats and hashed "3.0", online hashed "3"."""
    events = [ev(T0 + i * 10, n=i % 37) for i in range(300)]
    arrivals = [e["ts"] for e in events]
    t = T0 + 4000
    online = _read(_online(events, arrivals), "c1", t)
    # through a DataFrame, where the int column may become float when it has gaps
    df = pd.DataFrame([{**e, "_arrival_ms": a} for e, a in zip(events, arrivals, strict=True)])
    df.loc[0, "n"] = np.nan  # float64 column now: 3 becomes 3.0 (that row is dead: missing n)
    df2 = pd.DataFrame({"card_id": ["c1"], "ts": [t]})
    offline = build_training_set(DEFS, df, df2, [VIEW.ref("n_distinct_5m")])
    want = _read(_online(events[1:], arrivals[1:]), "c1", t)["n_distinct_5m"]
    assert float(offline[VIEW.ref("n_distinct_5m")][0]) == want
    assert online["n_distinct_5m"] == _offline(events, arrivals, "c1", t)["n_distinct_5m"]


def test_value_identity_is_per_field_so_3_and_true_do_not_share_a_register() -> None:
    """Was: one value-hash cache for all fields, and ``1 == 1.0 == True`` as dict keys: the first
    value a process saw fixed the register for the others."""
    flag_first = EventDecoder(DEFS).decode([orjson.dumps(ev(T0, flag=True, n=1))], T0)
    fresh = EventDecoder(DEFS).decode([orjson.dumps(ev(T0, flag=False, n=1))], T0)
    layout = VIEW.layout()
    gid = {g.field: g.gid for g in layout.groups if g.hll}

    def reg(batch: Any, field: str) -> tuple[int, int]:
        return next((op[8], op[9]) for op in batch.ops if op[1] == gid[field])

    assert reg(flag_first, "n") == reg(fresh, "n") == hll_position(1, typ="int")
    assert reg(flag_first, "flag") == hll_position(True, typ="bool")
    assert value_identity(True, "bool") == b"true" and value_identity(1, "int") == b"1"
    # documented: within an int field 3 and 3.0 are one value; within a float field too
    assert value_identity(3, "int") == value_identity(3.0, "int") == b"3"
    assert value_identity(3, "float") == value_identity(3.0, "float") == b"3.0"


def test_admission_does_not_depend_on_other_views_of_the_source() -> None:
    """Was: ingest dead-lettered a whole event for any invalid field of any view on its source,
    offline checked only the view's own fields."""
    only_counts = FeatureView("c", TX, [count("1m")])
    alone = FeatureDefinitions.of([only_counts])
    shared = FeatureDefinitions.of([only_counts, _view()])
    events = [ev(T0 + 10), ev(T0 + 20, n=1.5), ev(T0 + 30, amount="12")]
    arrivals = [T0 + 10, T0 + 20, T0 + 30]
    t = T0 + 100
    got = [_read(_online(events, arrivals, defs=d, view="c"), "c1", t)["count_1m"]
           for d in (alone, shared)]
    off = [_offline(events, arrivals, "c1", t, defs=d, view="c")["count_1m"]
           for d in (alone, shared)]
    assert got == off == [1.0, 1.0]


def test_overflow_gives_the_ieee_answers_on_every_path(redis_server) -> None:
    """Was: two events of 1e308 gave NaN sum/mean/stddev online; offline sum 1.797e308, mean inf."""
    from redline.features.online.redis import RedisStore

    events = [ev(T0 + 10, amount=1e308), ev(T0 + 20, amount=1e308)]
    arrivals = [T0 + 10, T0 + 20]
    t = T0 + 100
    for got in (_read(_online(events, arrivals), "c1", t),
                _read(_online(events, arrivals, RedisStore(redis_server.url)), "c1", t),
                _offline(events, arrivals, "c1", t)):
        assert got["amount_sum_1m"] == math.inf
        assert got["amount_mean_5m"] == 1e308
        assert got["amount_stddev_5m"] == 0.0
        assert got["amount_max_5m"] == 1e308


def test_timestamps_parse_the_same_everywhere(tmp_path: Path) -> None:
    """Was: ISO times came out in seconds under pandas 3; one garbage value in an integer time
    column dropped the whole column offline; numeric strings were accepted by `ingest file` and
    dropped by `training-set`; a string amount was refused online and counted offline."""
    iso = "2026-01-01T00:00:01.500Z"
    rows = [ev(iso), ev(T0 + 2000), ev(str(T0 + 3000)), ev("garbage"), ev(T0 + 4000, amount="12")]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    t = T0 + 30_000
    ing = Ingestor(DEFS, MemoryStore())
    res = replay_file(ing, path)
    assert res.accepted == 3 and len(res.rejected) == 2
    online = _read(ing.store.reader([VIEW]), "c1", t)
    labels = pd.DataFrame({"card_id": ["c1"], "ts": [t]})
    offline = build_training_set(DEFS, read_events(path), labels, [VIEW.ref("count_1m")])
    assert online["count_1m"] == float(offline[VIEW.ref("count_1m")][0]) == 3.0
    # Parquet datetimes of any unit (pandas 3 reads ms/us where pandas 2 read ns)
    for unit in ("ms", "us", "ns"):
        df = pd.DataFrame([ev(T0 + 1500), ev(T0 + 2500)])
        df["ts"] = pd.to_datetime(df["ts"], unit="ms", utc=True).astype(f"datetime64[{unit}, UTC]")
        pq = tmp_path / f"events-{unit}.parquet"
        df.to_parquet(pq)
        got = build_training_set(DEFS, read_events(pq), labels, [VIEW.ref("count_1m")])
        assert float(got[VIEW.ref("count_1m")][0]) == 2.0, unit


def test_csv_is_read_as_text_and_decoded_like_a_stream_entry(tmp_path: Path) -> None:
    path = tmp_path / "events.csv"
    path.write_text("card_id,amount,merchant,n,flag,ts\n"
                    f"c1,12,m1,3,true,{T0 + 1000}\n"
                    f"c1,x,m1,3,true,{T0 + 1100}\n"
                    f"c1,1.5,m2,4,false,not-a-time\n"
                    f"c1,2.5,m2,4,false,{T0 + 1200}\n")
    labels = pd.DataFrame({"card_id": ["c1"], "ts": [T0 + 5000]})
    ing = Ingestor(DEFS, MemoryStore())
    res = replay_file(ing, path)
    assert res.accepted == 2
    online = _read(ing.store.reader([VIEW]), "c1", T0 + 5000)
    offline = build_training_set(DEFS, read_events(path), labels)
    for f in NAMES:
        assert isclose(online[f], float(offline[VIEW.ref(f)][0])), f
    assert online["amount_sum_1m"] == 14.5


# --- brute force --------------------------------------------------------------------------------

def _stream(seed: int, n: int = 700) -> tuple[list[dict[str, Any]], list[int], list[bool]]:
    """Events in arrival order: late, out-of-order, future, duplicate deliveries, equal event
    times, tile-boundary times, tiny and large values, malformed events."""
    rng = random.Random(seed)
    events, arrivals, valid = [], [], []
    t = T0
    for _ in range(n):
        t += rng.choice([0, 0, 1, 50, 200, 900])
        u = rng.random()
        if u < 0.15:
            ts = (t // 5000) * 5000  # a tile boundary, shared by many events
        elif u < 0.75:
            ts = t - rng.randint(0, 3000)
        elif u < 0.85:
            ts = t - rng.randint(100_000, 150_000)  # some within 2 min lateness, some too late
        elif u < 0.9:
            ts = t + rng.randint(0, 1500)  # some beyond the 1 s clock skew
        else:
            ts = t
        amount = rng.choice([rng.uniform(-50, 500), 1e-300, -2.5e-200, 1e12, 7.0, 7.0])
        e = ev(ts, f"c{rng.randrange(4)}", amount=amount, merchant=f"m{rng.randrange(30)}",
               n=rng.randrange(20), flag=rng.random() < 0.5)
        ok = True
        if rng.random() < 0.04:
            e["amount"], ok = rng.choice(["12", None, True]), False
        events.append(e)
        arrivals.append(t)
        valid.append(ok)
        if rng.random() < 0.08:  # a duplicate delivery, a little later
            t += rng.randint(0, 500)
            events.append(dict(e))
            arrivals.append(t)
            valid.append(ok)
    return events, arrivals, valid


def _brute(events: list[dict[str, Any]], arrivals: list[int], valid: list[bool], card: str,
           t: int) -> dict[str, float]:
    """Every window from its definition, event by event, sharing no code with the stores."""
    plan = EventDecoder(DEFS).plans["tx"]
    out: dict[str, float] = {}
    admitted = [(e, a) for e, a, ok in zip(events, arrivals, valid, strict=True)
                if ok and e["card_id"] == card and a <= t
                and a - e["ts"] <= 120_000 and e["ts"] - a <= 1000]

    def within(window_ms: int, tile_ms: int) -> list[tuple[dict[str, Any], int]]:
        hi = t // tile_ms
        lo = hi - window_ms // tile_ms + 1
        return [(e, a) for e, a in admitted if lo <= e["ts"] // tile_ms <= hi]

    for agg in VIEW.features:
        inside = within(agg.window_ms, agg.tile_ms)
        numeric = agg.field and agg.kind != "distinct"
        xs = [float(e[agg.field]) for e, _ in inside] if numeric else []
        name = agg.feature_name
        if agg.kind == "count":
            out[name] = float(len(inside))
        elif agg.kind == "sum":
            out[name] = math.fsum(xs)
        elif agg.kind == "distinct":
            h = HyperLogLog()
            for e, _ in inside:
                h.add(*hll_position(e[agg.field], typ=plan.types[agg.field]))
            out[name] = h.get() if inside else 0.0
        elif not inside:
            out[name] = math.nan
        elif agg.kind == "mean":
            out[name] = math.fsum(xs) / len(xs)
        elif agg.kind == "min":
            out[name] = min(xs)
        elif agg.kind == "max":
            out[name] = max(xs)
        elif agg.kind == "stddev":
            out[name] = statistics.pstdev(xs)
        elif agg.kind == "last":
            key = [(e["ts"], a, plan.stable_id(e["ts"], card, e), float(e["amount"]))
                   for e, a in inside]
            out[name] = max(key)[3]
    return out


def _close(a: float, b: float, kind: str) -> bool:
    if kind in ("count", "min", "max", "last", "distinct"):
        return (a == b) or (math.isnan(a) and math.isnan(b))
    return isclose(a, b, rel=1e-9, abs_tol=1e-6)


def test_brute_force_equals_every_online_path_and_the_offline_builder(redis_server) -> None:
    from redline.features.ingest import StreamConsumer
    from redline.features.online.redis import RedisStore

    events, arrivals, valid = _stream(11)
    stream_times = sorted({a for a in arrivals})
    cards = ["c0", "c1", "c2", "c3", "nobody"]
    last_arrival = arrivals[-1]
    times = [last_arrival + d for d in (0, 700, 5_000, 30_000, 61_000, 200_000)]
    # online paths, each fed the whole stream in arrival order
    mem = _online(events, arrivals)
    # bulk writes get a long timeout: redis-py retries a timed-out call and a plain write is not
    # idempotent (on a busy machine a 700-event script can take longer than 50 ms)
    red_store = RedisStore(redis_server.url, timeout_ms=10_000)
    Ingestor(DEFS, red_store).ingest([orjson.dumps(e) for e in events], arrivals)
    red = red_store.reader([VIEW])
    sdb = RedisStore(redis_server.url.rsplit("/", 1)[0] + "/3", timeout_ms=10_000)  # own db
    seq: dict[int, int] = {}
    pipe = sdb.client.pipeline(transaction=False)
    for e, a in zip(events, arrivals, strict=True):  # the entry id is the arrival
        seq[a] = seq.get(a, -1) + 1
        pipe.xadd("s", {"d": orjson.dumps(e)}, id=f"{a}-{seq[a]}")
    pipe.execute()
    cons = StreamConsumer(DEFS, sdb, stream="s", group="g", batch=97, block_ms=1)
    for _ in range(200):
        cons.poll()
        cons.flush()
        if cons.counts.accepted + cons.counts.dead >= len(events):
            break
    assert cons.counts.accepted + cons.counts.dead == len(events)
    assert cons.counts.dead == sum(1 for e, a, ok in zip(events, arrivals, valid, strict=True)
                                   if not ok or a - e["ts"] > 120_000 or e["ts"] - a > 1000)
    stream = sdb.reader([VIEW])
    rows = [(c, t) for c in cards for t in times]
    labels = pd.DataFrame({"card_id": [r[0] for r in rows], "ts": [r[1] for r in rows]})
    log = EventLog([orjson.dumps({**e, "_arrival_ms": a})
                    for e, a in zip(events, arrivals, strict=True)])
    offline = build_training_set(DEFS, log, labels, [VIEW.ref(f) for f in NAMES])
    kinds = {a.feature_name: a.kind for a in VIEW.features}
    bad: list[tuple[str, str, int, str, float, float]] = []
    compared = 0
    for i, (card, t) in enumerate(rows):
        want = _brute(events, arrivals, valid, card, t)
        for path, got in (("memory", _read(mem, card, t)), ("redis", _read(red, card, t)),
                          ("stream", _read(stream, card, t)),
                          ("offline", {f: float(offline[VIEW.ref(f)][i]) for f in NAMES})):
            for f in NAMES:
                compared += 1
                if not _close(got[f], want[f], kinds[f]):
                    bad.append((path, card, t, f, got[f], want[f]))
    assert compared == len(rows) * len(NAMES) * 4
    assert bad == []
    assert any(_brute(events, arrivals, valid, "c1", t)["count_1m"] > 0 for t in times)
    assert len(stream_times) < len(arrivals)  # the stream really has equal arrivals



# --- event ids ---------------------------------------------------------------------------------

IDS = EventSource("tx", CARD, {"amount": float, "merchant": str, "n": int, "flag": bool},
                  allowed_lateness="2m", max_clock_skew="1s", event_id="event_id",
                  dedup_window="1m")
IDS_DEFS = FeatureDefinitions.of([_view(src=IDS)])


@pytest.mark.slow
def test_a_redelivered_event_is_applied_once_on_every_path(redis_server) -> None:
    """Was: a redelivered event (same event id) was counted twice on every path."""
    from redline.features.ingest import StreamConsumer
    from redline.features.online.redis import RedisStore

    events = [ev(T0 + 10 * i, event_id=f"e{i % 40}", amount=float(i % 40)) for i in range(120)]
    events.append(ev(T0 + 90_000, event_id="e1", amount=1.0))  # same id, outside the 1 min window
    arrivals = [T0 + 10 * i + 5 for i in range(120)] + [T0 + 90_000]
    t = T0 + 90_001
    want = {"count_1m": 1.0, "amount_sum_1m": 1.0}  # only the late re-send is in the 1 m window
    mem = _read(_online(events, arrivals, defs=IDS_DEFS), "c1", t)
    red_store = RedisStore(redis_server.url, timeout_ms=10_000)
    red = _read(_online(events, arrivals, red_store, defs=IDS_DEFS), "c1", t)
    off = _offline(events, arrivals, "c1", t, defs=IDS_DEFS)
    sdb = RedisStore(redis_server.url.rsplit("/", 1)[0] + "/4", timeout_ms=10_000)
    pipe = sdb.client.pipeline(transaction=False)
    for e, a in zip(events, arrivals, strict=True):
        pipe.xadd("s", {"d": orjson.dumps(e)}, id=f"{a}-0")
    pipe.execute()
    cons = StreamConsumer(IDS_DEFS, sdb, stream="s", group="g", batch=17, block_ms=1)
    # until every entry is in (an empty read waits Redis's ~100 ms timer tick: not a fixed
    # number of polls)
    for _ in range(50):
        cons.poll()
        cons.flush()
        if cons.counts.accepted + cons.counts.dead >= len(events):
            break
    assert cons.counts.accepted + cons.counts.dead == len(events)
    stream = _read(sdb.reader([IDS_DEFS.view("v")]), "c1", t)
    for got in (mem, red, off, stream):
        assert {k: got[k] for k in want} == want
    # and inside the window each id counted once: 40 distinct ids at the 5 m read time
    early = T0 + 1300
    for reader in (_online(events[:120], arrivals[:120], defs=IDS_DEFS),
                   _online(events[:120], arrivals[:120], RedisStore(
                       redis_server.url.rsplit("/", 1)[0] + "/5"), defs=IDS_DEFS)):
        assert _read(reader, "c1", early)["count_1m"] == 40.0
    assert _offline(events[:120], arrivals[:120], "c1", early, defs=IDS_DEFS)["count_1m"] == 40.0
