"""The decoder's inline fast path gives what the general functions give, event for event.

``EventDecoder._add`` decides the common case (JSON values already of their schema types) inline
and by exact type; :func:`_reference` is the decoder before that change, written with the general
functions (``to_ms``, ``entity_id_of``, ``coerce``, ``admit``, ``place``, the plan's
``stable_id``). Hypothesis events mix every value the general path accepts or refuses, and each
is decoded as JSON bytes, as a dict and as a flat string map: tile updates, keys, accepted tags
and dead-letter reasons must be equal.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redline.features import (
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    agg_sum,
    count,
    distinct,
    last,
    mean,
)
from redline.features.event_values import coerce
from redline.features.events import (
    MAX_TS_MS,
    MIN_TS_MS,
    EventDecoder,
    Rejected,
    UpdateBatch,
    entity_id_of,
    event_id_of,
    stable_id,
    to_ms,
)
from redline.features.tiles import admit, place

NOW = 1_700_000_000_000


def _defs(event_id: str | None) -> FeatureDefinitions:
    card = Entity("card", "card_id")
    src = EventSource("tx", card, {"card_id": str, "amount": float, "qty": int, "flag": bool,
                                   "merchant": str}, allowed_lateness="10m", event_id=event_id)
    return FeatureDefinitions.of([
        FeatureView("a", src, [count("1h"), agg_sum("amount", "1h"), mean("qty", "5m"),
                               last("amount", "1m")]),
        FeatureView("b", src, [agg_sum("flag", "1h"), distinct("merchant", "1h"),
                               agg_sum("amount", "5m")]),
    ])


def _reference(dec: EventDecoder, batch: UpdateBatch, ev: dict[str, Any], flat: bool,
               arrival: int, tag: int) -> str:
    """``EventDecoder._add`` before the fast path (same checks, same order, same messages)."""
    plan = dec.plans["tx"]
    src = plan.source
    ts = to_ms(ev.get(src.timestamp))
    if ts is None:
        if src.timestamp not in ev:
            return f"missing field '{src.timestamp}' (event time, epoch ms or ISO-8601)"
        got = ev[src.timestamp]
        return (f"field '{src.timestamp}' must be epoch milliseconds or ISO-8601 (years "
                f"1-9999), got {got!r}")
    eid = entity_id_of(ev.get(plan.join_key))
    if eid is None:
        if plan.join_key not in ev:
            return f"missing field '{plan.join_key}' (entity '{plan.entity}' id)"
        got = ev[plan.join_key]
        return f"field '{plan.join_key}' must be a string or integer id, got {got!r}"
    values: dict[str, Any] = {}
    for name, typ in plan.fields:
        if name not in ev:
            return f"missing field '{name}'"
        v = coerce(ev[name], typ, flat)
        if v is None:
            return f"field '{name}' must be {typ}, got {ev[name]!r}"
        values[name] = v
    why = admit(ts, arrival, plan.lateness_ms, plan.skew_ms)
    if why == "late":
        return (f"late: arrived {arrival - ts} ms after its event time, allowed lateness is "
                f"{plan.lateness_ms} ms")
    if why == "future":
        return (f"future: event time is {ts - arrival} ms ahead of arrival, max clock skew is "
                f"{plan.skew_ms} ms")
    if plan.event_id:
        ident = event_id_of(ev.get(plan.event_id))
        if ident is None:
            if plan.event_id not in ev:
                return f"missing field '{plan.event_id}' (the event id)"
            got = ev[plan.event_id]
            return f"field '{plan.event_id}' must be a string or integer id, got {got!r}"
        sid = stable_id([plan.name_bytes, b"id", ident.encode()])
    else:
        sid = plan.stable_id(ts, eid, values)
    spots = [place(ts, arrival, tile_ms, tiles, ring) for tile_ms, tiles, ring in plan.grids]
    skey = plan.store_head + eid + plan.store_tail
    for head, tail, ttl, vtag, groups in plan.views:
        k = -1
        for gid, fld, hll, gi in groups:
            where = spots[gi]
            if where is None:
                continue
            idx, slot = where
            if k < 0:
                k = batch.key(head + eid + tail, ttl, plan.dedup_ms, skey, vtag)
            if fld is None:
                batch.ops.append((k, gid, idx, slot, ts, arrival, sid, 0.0, -1, 0, tag))
            elif hll:
                reg, rank = plan.hll(fld, values[fld])
                batch.ops.append((k, gid, idx, slot, ts, arrival, sid, 0.0, reg, rank, tag))
            else:
                batch.ops.append((k, gid, idx, slot, ts, arrival, sid, float(values[fld]), -1,
                                  0, tag))
    batch.accepted.append(tag)
    batch.event_ts.append(ts)
    return ""


_odd = st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=False), st.booleans(),
                st.text(max_size=4), st.none(), st.sampled_from(["1.5", "2", "x", ""]))
# per field: the values the schema takes, and others (some accepted too, by the general path)
_FIELDS = {
    "card_id": (st.one_of(st.sampled_from(["c1", "c2"]), st.integers(0, 3)), _odd),
    "ts": (st.integers(NOW - 700_000, NOW + 1_500),
           st.one_of(st.floats(NOW - 700_000, NOW + 1_500), st.integers(), _odd,
                     st.sampled_from([str(NOW - 1000), "2023-11-14T22:13:19.000Z",
                                      MAX_TS_MS + 1, MIN_TS_MS - 1, 2**62]))),
    "amount": (st.floats(-1e6, 1e6), _odd),
    "qty": (st.integers(-5, 5), st.one_of(st.floats(-5, 5), _odd)),
    "flag": (st.booleans(), _odd),
    "merchant": (st.sampled_from(["m1", "m2", "m3"]), _odd),
    "eid": (st.one_of(st.sampled_from(["e1", "e2"]), st.integers(0, 3)), _odd),
}


@st.composite
def _event(draw: st.DrawFn) -> dict[str, Any]:
    """A complete event of schema-typed values (the fast path's case), or one with a field
    missing or of another value (the general path's)."""
    ev = {k: draw(good) for k, (good, _) in _FIELDS.items()}
    change = draw(st.sampled_from([None, None, None, *sorted(_FIELDS)]))
    if change is not None:
        if draw(st.booleans()):
            del ev[change]
        else:
            ev[change] = draw(_FIELDS[change][1])
    return ev


def _flat(ev: dict[str, Any]) -> dict[bytes, bytes]:
    return {k.encode(): orjson.dumps(v).strip(b'"') for k, v in ev.items()}


def _same(a: UpdateBatch, b: UpdateBatch) -> None:
    assert a.ops == b.ops
    assert (a.keys, a.key_ttl_ms, a.key_dedup_ms, a.key_store, a.key_tag) == (
        b.keys, b.key_ttl_ms, b.key_dedup_ms, b.key_store, b.key_tag)
    assert (a.accepted, a.event_ts) == (b.accepted, b.event_ts)
    assert [(r.reason, r.tag) for r in a.rejected] == [(r.reason, r.tag) for r in b.rejected]


def _check(events: list[dict[str, Any]], with_id: bool) -> None:
    """Decode ``events`` as JSON bytes, dicts and flat maps; compare with :func:`_reference`."""
    dec = EventDecoder(_defs("eid" if with_id else None))
    events = [ev for ev in events
              if all(not isinstance(v, float) or v == v for v in ev.values())]  # JSON has no NaN
    for form, flat in (("json", False), ("dict", False), ("flat", True)):
        expected = UpdateBatch()
        raws: list[Any] = []
        for ev in events:
            try:
                raw: Any = orjson.dumps(ev)
            except orjson.JSONEncodeError:
                continue
            parsed = orjson.loads(raw)
            if form == "dict":
                raw = parsed
            elif form == "flat":
                raw = _flat(parsed)
                parsed = {k.decode(): v for k, v in raw.items()}
            reason = _reference(dec, expected, parsed, flat, NOW, len(raws))
            if reason:
                expected.rejected.append(Rejected(reason, b"", len(raws)))
            raws.append(raw)
        got = EventDecoder(_defs("eid" if with_id else None)).decode(raws, NOW)
        _same(got, expected)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(_event(), min_size=1, max_size=12), st.booleans())
def test_fast_path_equals_the_general_functions(events: list[dict[str, Any]], with_id: bool
                                                ) -> None:
    _check(events, with_id)


_GOOD = {"card_id": "c1", "ts": NOW - 1000, "amount": 2.5, "qty": 3, "flag": True,
         "merchant": "m1", "eid": "e1"}


def test_edge_values_equal_the_general_functions() -> None:
    """The values at the fast path's edges, one field changed at a time."""
    edges = {
        "ts": [MAX_TS_MS, MAX_TS_MS + 1, MIN_TS_MS - 1, 2**62, NOW - 600_000, NOW - 600_001,
               NOW + 1000, NOW + 1001, float(NOW), NOW - 0.5, True, str(NOW), None],
        "card_id": ["", 0, -1, True, 1.0, None, "c2"],
        "amount": [0, -0.0, 1e308, 10**19, True, "1.5", None, 5e-324],
        "qty": [2.0, 2.5, True, 10**19, "2", -0.0],
        "flag": [1, 0, "true", None, False],
        "merchant": ["", 3, None, "m2"],
        "eid": ["", 0, True, 1.5, None, "e2"],
    }
    events = [_GOOD] + [{**_GOOD, k: v} for k, vs in edges.items() for v in vs]
    events += [{k: v for k, v in _GOOD.items() if k != drop} for drop in _GOOD]
    for with_id in (False, True):
        _check(events, with_id)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.floats(NOW - 600_000, NOW + 1000), st.integers(NOW - 600_000, NOW + 1000)))
def test_a_timestamp_in_a_string_is_read_as_the_same_number(ts: float) -> None:
    """One rule: an event time sent as a JSON number, as that number's text in a JSON string,
    or as a flat map's text (a Redis Stream field) is the same event time."""
    forms = [orjson.dumps({**_GOOD, "ts": ts}),
             orjson.dumps({**_GOOD, "ts": orjson.dumps(ts).decode()}),
             _flat({**_GOOD, "ts": ts})]
    for raw in forms:
        got = EventDecoder(_defs(None)).decode([raw], NOW)
        assert not got.rejected, (raw, got.rejected[0].reason)
        assert got.event_ts == [int(ts // 1)], raw


def test_a_fractional_timestamp_string_is_accepted_like_its_number() -> None:
    arrival = 1_790_000_000_005
    number = EventDecoder(_defs(None)).decode(
        [orjson.dumps({**_GOOD, "ts": 1790000000000.75})], arrival)
    text = EventDecoder(_defs(None)).decode(
        [orjson.dumps({**_GOOD, "ts": "1790000000000.75"})], arrival)
    assert not number.rejected and not text.rejected, text.rejected
    assert number.event_ts == text.event_ts == [1_790_000_000_000]
    assert number.ops == text.ops
    for bad in ("1790000000000.75x", "nan", "inf", "1e400", "1.2.3"):
        got = EventDecoder(_defs(None)).decode([orjson.dumps({**_GOOD, "ts": bad})], arrival)
        assert got.rejected and "must be epoch milliseconds or ISO-8601" in got.rejected[0].reason


def test_tile_visibility_at_each_grid_edge_equals_tiles_place() -> None:
    """Whether an event's tile is still read from its arrival on, decided around each grid's
    edge (lags near ``(tiles - 1) * tile_ms`` and near tile boundaries), at arrivals on and off a
    tile boundary: the same tiles as ``tiles.place``, and some events fall outside a window."""
    on_edge = NOW - NOW % 300_000
    lags = [-1000, 0, 1, 4_999, 5_000, 54_999, 55_000, 55_001, 59_999, 60_000, 60_001, 269_999,
            270_000, 270_001, 299_999, 300_000, 300_001, 599_999, 600_000]
    for arrival in (on_edge, on_edge - 1, on_edge + 1, NOW, NOW + 4_999, NOW + 29_999):
        expected = UpdateBatch()
        raws = []
        for lag in lags:
            ev = {**_GOOD, "ts": arrival - lag}
            assert not _reference(EventDecoder(_defs(None)), expected, ev, False, arrival,
                                  len(raws))
            raws.append(orjson.dumps(ev))
        got = EventDecoder(_defs(None)).decode(raws, arrival)
        _same(got, expected)
        per_event = len(EventDecoder(_defs(None)).decode(raws[:1], arrival).ops)
        assert len(got.ops) < per_event * len(lags)  # the late ones skip the 5 s and 30 s tiles
