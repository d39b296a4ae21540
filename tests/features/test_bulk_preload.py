"""The columnar file replay (``online.bulk``) leaves the memory store exactly as the reference
(``MemoryStore.write``, op by op and batch by batch) does.

Hostile streams (``streams.py``: out-of-order, late and future events, ties in event time, tile
boundaries, redeliveries, huge and tiny values) are mixed with bad rows, integer-like ids, times
as text and negative zeros, and replayed both ways: every ring record must have the same bits and
types (compared by ``repr``), every remembered event id the same arrival, and the replay the same
accepted count, dead letters and reads. Small batches and a small flush size make records carry
over between batches and flushes.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redline.features import FeatureDefinitions, FeatureView
from redline.features.definitions import load_definitions
from redline.features.events import EventDecoder
from redline.features.ingest import Ingestor, replay_file
from redline.features.online import MemoryStore, bulk, memory
from redline.features.verify import random_events
from tests.features import streams

FRAUD = Path(__file__).resolve().parents[2] / "examples" / "fraud"


def _dedup_definitions() -> FeatureDefinitions:
    """The streams' view on a source with event ids, deduplicated over one minute of arrival."""
    base = streams.definitions().view("card_tx")
    tx = dataclasses.replace(base.source, event_id="event_id", dedup_window="1m")
    return FeatureDefinitions.of([FeatureView(base.name, tx, list(base.features))])


BAD_ROWS = [
    b"not json", b"[1, 2]", b'"text"', b"{}", b'{"source": "nope", "ts": 1}',
    b'{"source": "tx", "card_id": "e1", "amount": 1.5}',
    b'{"source": "tx", "card_id": true, "ts": 1767225600000, "amount": 1.0}',
]


def _hostile(defs: FeatureDefinitions, seed: int, n: int) -> list[bytes]:
    """A stream of the definitions' source as JSON lines, with the decoder's awkward cases."""
    src = next(iter(defs.sources.values()))
    rng = random.Random(seed)
    lines = []
    for ev in random_events(src, n, seed, streams.T0, entities=6):
        u = rng.random()
        if u < 0.05:
            ev["card_id"] = int(ev["card_id"][1:])  # an integer id: entity "3"
        elif u < 0.08 and "event_id" in ev:
            ev["event_id"] = rng.randrange(5)  # integer event ids, some repeated
        elif u < 0.11:
            ev["ts"] = str(ev["ts"])  # a time as text
        elif u < 0.13:
            ev["amount"] = -0.0
        elif u < 0.15:
            ev["n"] = float(ev["n"])  # an integral float in an int field
        elif u < 0.17:
            ev["amount"] = "12"  # a wrong type: a dead letter
        elif u < 0.19:
            ev["amount"] = rng.choice([1.7e308, -1.7e308])  # sums beyond the double range
        lines.append(orjson.dumps(ev))
        if rng.random() < 0.02:
            lines.append(rng.choice(BAD_ROWS))
    return lines


def _state(store: MemoryStore) -> str:
    """Every ring record and remembered id, in a canonical order, with its exact bits."""
    return repr(sorted((key, sorted(s.rings.items()), sorted(s.ids.items()))
                       for key, s in store.data.items()))


def _replay(defs: FeatureDefinitions, path: Path, use_bulk: bool, batch: int
            ) -> tuple[MemoryStore, Any, Ingestor]:
    store = MemoryStore()
    ingestor = Ingestor(defs, store)
    return store, replay_file(ingestor, path, batch=batch, bulk=use_bulk), ingestor


def _reads(store: MemoryStore, defs: FeatureDefinitions, now: int,
           ids: list[str] | None = None) -> list[np.ndarray]:
    """Each view read at ``now`` for ``ids`` (default: every entity the store holds for it)."""
    out = []
    for view in defs.views.values():
        names = ids if ids is not None else sorted(
            key.split(":")[2].rstrip("}") for key in store.data if f"}}:{view.name}:" in key)
        if names:
            feats, missing = store.reader([view]).read(names, now=now, dtype=np.float64)
            out.append(np.column_stack([feats, missing]))
    return out


def assert_same_replay(defs: FeatureDefinitions, lines: list[bytes], batch: int,
                       flush_ops: int = bulk.FLUSH_OPS) -> MemoryStore:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        ref, ref_res, ref_ing = _replay(defs, path, False, batch)
        saved = bulk.FLUSH_OPS
        bulk.FLUSH_OPS = flush_ops
        try:
            got, res, ing = _replay(defs, path, True, batch)
        finally:
            bulk.FLUSH_OPS = saved
    assert _state(got) == _state(ref)
    assert set(got.data) == set(ref.data)
    assert res.accepted == ref_res.accepted
    assert [(r.reason, r.raw, r.tag) for r in res.rejected] == \
        [(r.reason, r.raw, r.tag) for r in ref_res.rejected]
    assert ing.stats() == ref_ing.stats()
    times = [s.rings[g][i][0] for s in ref.data.values() for g in s.rings
             for i in range(len(s.rings[g])) if s.rings[g][i] is not None]
    for now in {streams.T0 + 90_000, max(times, default=0) * 1000}:  # reads merge the same tiles
        for a, b in zip(_reads(got, defs, now), _reads(ref, defs, now), strict=True):
            assert np.array_equal(a, b, equal_nan=True)
    return got


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 700), dedup=st.booleans(),
       batch=st.sampled_from([1, 3, 50, 5000]), flush_ops=st.sampled_from([7, 10**6]))
def test_bulk_replay_equals_the_reference(seed: int, n: int, dedup: bool, batch: int,
                                          flush_ops: int) -> None:
    defs = _dedup_definitions() if dedup else streams.definitions()
    assert_same_replay(defs, _hostile(defs, seed, n), batch, flush_ops)


def test_a_long_hostile_stream_with_redeliveries() -> None:
    defs = _dedup_definitions()
    lines = _hostile(defs, 11, 4000)
    store = assert_same_replay(defs, lines, 500, flush_ops=900)
    assert any(s.ids for s in store.data.values())  # deduplication took part
    assert any(len(ring) > 1 for s in store.data.values() for ring in s.rings.values())


def test_the_demo_events_replay_alike(tmp_path: Path) -> None:
    """The fraud example's events file (what ``make demo`` preloads), smaller."""
    sys.path.insert(0, str(FRAUD))
    try:
        import generate  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(FRAUD))
    generate.write(generate.generate(cards=150, days=2, seed=5), tmp_path / "data")
    defs = load_definitions(FRAUD / "features.py")
    lines = (tmp_path / "data" / "events.jsonl").read_bytes().splitlines()
    store = assert_same_replay(defs, lines, 5000)
    assert len(store.data) > 100


def test_a_read_cache_is_not_left_stale() -> None:
    """Windows a read cached before a bulk replay are merged again from the tiles it wrote:
    the reads equal those of a store no read touched before."""
    defs = streams.definitions()
    lines = _hostile(defs, 3, 300)
    ids = [f"e{i}" for i in range(6)]
    now = streams.T0 + 60_000
    with tempfile.TemporaryDirectory() as tmp:
        first, rest = Path(tmp) / "first.jsonl", Path(tmp) / "rest.jsonl"
        first.write_bytes(b"\n".join(lines[:150]) + b"\n")
        rest.write_bytes(b"\n".join(lines[150:]) + b"\n")
        reads = []
        for read_between in (True, False):
            store = MemoryStore()
            ingestor = Ingestor(defs, store)
            replay_file(ingestor, first)
            if read_between:
                _reads(store, defs, now, ids)  # caches the windows at ``now``
            replay_file(ingestor, rest)
            reads.append(_reads(store, defs, now, ids)[0])
    assert np.array_equal(reads[0], reads[1], equal_nan=True)


def _event(entity: str, offset_ms: int, amount: float, event_id: str | int | None = None,
           arrival_ms: int | None = None, merchant: str = "m") -> bytes:
    ev: dict[str, Any] = {"source": "tx", "card_id": entity, "ts": streams.T0 + offset_ms,
                          "amount": amount, "merchant": merchant, "n": 1}
    if event_id is not None:
        ev["event_id"] = event_id
    if arrival_ms is not None:
        ev["_arrival_ms"] = streams.T0 + arrival_ms
    return orjson.dumps(ev)


EDGES = [
    # signed zeros: min and max keep the first of equal values
    _event("z", 0, 0.0), _event("z", 1, -0.0), _event("z", 2, 0.0),
    _event("z", 10_000, -0.0), _event("z", 10_001, 0.0),
    # a sum that leaves the double range, then comes back into it
    _event("big", 0, 1.7e308), _event("big", 1, 1.7e308), _event("big", 2, -1.7e308),
    _event("big", 3, 5.0),
    _event("same", 0, 1e308), _event("same", 1, 1e308), _event("same", 2, 1e308),
    # a redelivery exactly the dedup window later is a duplicate; a millisecond more is not
    _event("d", 100, 1.0, "w", 100), _event("d", 60_100, 2.0, "w", 60_100),
    _event("d", 60_101, 3.0, "w", 60_101),
    # an id older than the window when a batch ends is forgotten, one a millisecond newer is not
    _event("f", 1_000, 1.0, "x", 1_000), _event("f", 1_001, 1.0, "y", 1_001),
    _event("f", 61_001, 1.0, "v", 61_001),
    _event("f", 1_010, 4.0, "x", 1_010), _event("f", 1_011, 8.0, "y", 1_011),
    # a slot's tile replaced by a newer one (a ring of every tile size turns in an hour), then
    # an event of the old tile, which no read can see any more
    _event("r", 0, 1.0, merchant="a"),
    _event("r", 3_600_000, 2.0, arrival_ms=3_600_000, merchant="b"),
    _event("r", 3_600_001, 3.0, arrival_ms=3_600_001, merchant="c"),
    _event("r", 3_600_002, 3.0, arrival_ms=3_600_002, merchant="d"),
    _event("r", 3_599_000, 4.0, arrival_ms=3_600_003, merchant="e"),
    # arrivals going back: older tiles of slots that hold newer ones (skipped), and of free ones
    *(_event("r", 3_600_000 - k * 5_000, 5.0, arrival_ms=3_600_000 - k * 5_000, merchant="f")
      for k in range(1, 400, 7)),
]


@pytest.mark.parametrize("batch", [1, 2, 5000])
@pytest.mark.parametrize("dedup", [False, True])
def test_edges_by_hand(batch: int, dedup: bool) -> None:
    defs = _dedup_definitions() if dedup else streams.definitions()
    assert_same_replay(defs, EDGES, batch)
    assert_same_replay(defs, EDGES, batch, flush_ops=1)


def test_keys_expired_between_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that jumps past every TTL between batches: the store's sweep drops the keys a
    batch did not touch, and a later event makes them again, empty, on both paths."""
    batches = [0]
    decode = EventDecoder.decode

    def counted(self: EventDecoder, *args: Any, **kwargs: Any) -> Any:
        batches[0] += 1
        return decode(self, *args, **kwargs)

    def clock() -> int:
        return streams.T0 + 10_000_000 * batches[0]

    monkeypatch.setattr(EventDecoder, "decode", counted)
    monkeypatch.setattr(memory, "now_ms", clock)
    monkeypatch.setattr(bulk, "now_ms", clock)
    defs = _dedup_definitions()
    lines = _hostile(defs, 5, 400)
    states, dropped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        for use_bulk in (False, True):
            batches[0] = 0
            store = MemoryStore()
            expire = store.expire
            gone: list[int] = []
            monkeypatch.setattr(store, "expire", lambda wall, f=expire, g=gone: g.append(f(wall)))
            replay_file(Ingestor(defs, store), path, batch=4, bulk=use_bulk)
            states.append(_state(store))
            dropped.append(sum(gone))
    assert states[0] == states[1]
    assert dropped[0] == dropped[1] > 0


def test_slot_order_without_the_combined_number() -> None:
    rng = np.random.default_rng(1)
    keys, gids = rng.integers(0, 50, 3000), rng.integers(0, 4, 3000)
    for top in (40, 2**60):  # a combined number, then one too large for it
        slots = rng.integers(0, top, 3000) // (top // 40) * (top // 40)
        assert np.array_equal(bulk._by_slot(keys, gids, slots), np.lexsort((slots, gids, keys)))


@pytest.mark.parametrize("bad", BAD_ROWS)
def test_only_bad_rows(bad: bytes) -> None:
    assert_same_replay(streams.definitions(), [bad, bad], 1)
