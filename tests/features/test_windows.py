"""Window edges, lateness, dead letters and validation through the real ingest path."""

from __future__ import annotations

import orjson
import pytest

from redline.errors import InvalidInput
from redline.features import (
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    MemoryStore,
    agg_sum,
    count,
    last,
)
from redline.features.ingest import Ingestor

T = 1_767_225_600_000  # a multiple of every tile size used here


@pytest.fixture
def setup():
    card = Entity("card", "card_id")
    src = EventSource("tx", card, {"card_id": str, "amount": float, "ok": bool, "qty": int},
                      allowed_lateness="30s", max_clock_skew="1s")
    view = FeatureView("v", src, [count("1m"), agg_sum("amount", "1m"), last("qty", "1m")])
    defs = FeatureDefinitions.of([view])
    store = MemoryStore()
    return defs, Ingestor(defs, store), store.reader([view])


def ev(ts: int, amount: float = 1.0, card: str = "c1", **kw) -> dict:
    return {"card_id": card, "amount": amount, "ok": True, "qty": 1, "ts": ts, **kw}


def test_window_edges(setup) -> None:
    defs, ing, reader = setup
    # tile 5 s, 12 tiles: a read at T + 60 s covers event times [T + 5 s, T + 65 s)
    res = ing.ingest([ev(T + 4_999, 1), ev(T + 5_000, 10)], [T + 4_999, T + 5_000])
    assert res.accepted == 2
    vals, missing = reader.read(["c1"], T + 60_000)
    assert vals[0][:2].tolist() == [1, 10]  # T + 4999 is out, T + 5000 is in
    vals, _ = reader.read(["c1"], T + 59_999)  # one ms earlier the window starts at T
    assert vals[0][:2].tolist() == [2, 11]
    ing.ingest([ev(T + 64_999, 100)], T + 64_999)
    vals, _ = reader.read(["c1"], T + 64_999)
    assert vals[0][:2].tolist() == [2, 110]
    vals, _ = reader.read(["c1"], T + 119_999)  # covers [T + 60 s, T + 120 s)
    assert vals[0][:2].tolist() == [1, 100]
    vals, missing = reader.read(["c1"], T + 120_000)
    assert vals[0][:2].tolist() == [0, 0] and not missing[0]  # known entity, empty window


def test_out_of_order_within_lateness_counts_late_beyond_is_dead_lettered(setup) -> None:
    defs, ing, reader = setup
    res = ing.ingest([ev(T + 10_000), ev(T + 1_000), ev(T + 10_000 - 30_001)], T + 10_000)
    assert res.accepted == 2
    assert [r.reason.split(":")[0] for r in res.rejected] == ["late"]
    assert "allowed lateness is 30000 ms" in res.rejected[0].reason
    res = ing.ingest([ev(T + 12_000)], T + 10_000)  # 2 s ahead, skew allows 1 s
    assert res.rejected[0].reason.startswith("future")
    assert ing.stats()["dead_by_reason"] == {"late": 1, "future": 1}
    vals, _ = reader.read(["c1"], T + 10_000)
    assert vals[0][0] == 2


def test_last_takes_the_latest_event_time_not_the_latest_arrival(setup) -> None:
    defs, ing, reader = setup
    ing.ingest([ev(T + 9_000, qty=9), ev(T + 2_000, qty=2)], T + 9_500)
    ing.ingest([ev(T + 9_000, qty=7)], T + 9_600)  # same time, later arrival wins
    vals, _ = reader.read(["c1"], T + 10_000)
    assert vals[0][2] == 7


@pytest.mark.parametrize("raw,reason", [
    (b"{oops", "unparseable: not valid JSON"),
    (b"[1, 2]", "unparseable: an event must be a JSON object, got list"),
    (orjson.dumps({"card_id": "c", "amount": 1.0, "ok": True, "qty": 1}), "missing field 'ts'"),
    (orjson.dumps({"amount": 1.0, "ok": True, "qty": 1, "ts": T}), "missing field 'card_id'"),
    (orjson.dumps(ev(T, amount="3")), "field 'amount' must be float, got '3'"),
    (orjson.dumps(ev(T, qty=1.5)), "field 'qty' must be int, got 1.5"),
    # every schema field is checked, used by a feature or not: admission must not depend on
    # which views share the source (the offline builder runs the same rule)
    (orjson.dumps(ev(T, ok=1)), "field 'ok' must be bool, got 1"),
    (orjson.dumps({**ev(T), "ts": "yesterday"}),
     "field 'ts' must be epoch milliseconds or ISO-8601"),
    (orjson.dumps({**ev(T), "source": "clicks"}), "unknown source 'clicks' (known: tx)"),
    (orjson.dumps({**ev(T), "card_id": True}), "field 'card_id' must be a string or integer id"),
])
def test_bad_events_are_dead_lettered_with_a_reason(setup, raw, reason) -> None:
    defs, ing, reader = setup
    res = ing.ingest([raw, orjson.dumps(ev(T))], T)
    if reason is None:
        assert res.accepted == 2
        return
    assert res.accepted == 1  # ingestion goes on after the bad event
    assert len(res.rejected) == 1 and res.rejected[0].tag == 0
    assert res.rejected[0].reason.startswith(reason)
    assert res.rejected[0].raw == raw
    assert list(ing.dead_letters)[0].reason == res.rejected[0].reason


def test_iso_timestamps_and_integer_ids(setup) -> None:
    defs, ing, reader = setup
    res = ing.ingest([{**ev(0), "ts": "2026-01-01T00:00:03Z", "card_id": 42}], T + 3_000)
    assert res.accepted == 1
    vals, missing = reader.read(["42"], T + 3_000)
    assert vals[0][0] == 1 and not missing[0]


def test_reader_errors(setup) -> None:
    defs, ing, reader = setup
    from redline.errors import FeatureNotFound

    with pytest.raises(FeatureNotFound, match="v:count_1m"):
        MemoryStore().reader([defs.view("v")], ["v:nope"])
    with pytest.raises(InvalidInput, match="missing ids for entity 'card'"):
        reader.read({"user": ["u1"]})
    vals, missing = reader.read(["nobody"], T)
    assert missing.tolist() == [True] and vals.dtype.name == "float32"
