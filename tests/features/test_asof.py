"""The offline builder's column path (``features/training/``) equals its event-by-event replay
through the decoder and a memory store, on the inputs that make them differ if anything does:
late, future, duplicate (with and without event ids), tied and malformed events, typed and
untyped columns, JSON lines, CSV text and DataFrames of every dtype the decoder meets."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest

from redline.errors import InvalidInput
from redline.features import Aggregation, FeatureDefinitions, FeatureView, last
from redline.features.offline import EventLog, build_training_set, read_events
from redline.features.training import keyed, values
from redline.features.training import last as last_values
from tests.features.test_training_serving import DEFS, IDS, IDS_DEFS, T0, TX, _stream, _view, ev

EXACT = ("count", "min", "max", "last", "distinct")


def _labels(events: list[dict[str, Any]], arrivals: list[int], seed: int, n: int = 400
            ) -> pd.DataFrame:
    rng = random.Random(seed)
    cards = ["c0", "c1", "c2", "c3", "nobody"]
    times = [rng.choice(arrivals) + rng.choice([0, 0, -1, 1, 999, 5_000, 61_000])
             for _ in range(n)]
    times += [(a // 5000) * 5000 for a in arrivals[::25]]  # tile boundaries
    return pd.DataFrame({"card_id": [rng.choice(cards) for _ in times], "ts": times})


def _same(defs: FeatureDefinitions, events: Any, labels: pd.DataFrame) -> int:
    """Compare both methods on every value; returns how many rows had events."""
    view = defs.view("v")
    refs = [view.ref(f) for f in view.feature_names]
    cols = build_training_set(defs, events, labels, refs, method="columns")
    ref = build_training_set(defs, events, labels, refs, method="replay")
    kinds = {o.name: o.kind for o in view.layout().outputs}
    for f in view.feature_names:
        a, b = cols[view.ref(f)].to_numpy(), ref[view.ref(f)].to_numpy()
        both_nan = np.isnan(a) & np.isnan(b)
        if kinds[f] in EXACT:
            bad = ~((a == b) | both_nan)
        else:
            with np.errstate(invalid="ignore"):
                bad = ~(np.isclose(a, b, rtol=1e-9, atol=1e-9) | both_nan | (a == b))
        assert not bad.any(), (f, np.flatnonzero(bad)[:5], a[bad][:5], b[bad][:5])
    return int((ref[view.ref("count_1m")] > 0).sum())


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("defs", [DEFS, IDS_DEFS], ids=["no-ids", "event-ids"])
def test_columns_equal_the_replay_on_json_lines(seed: int, defs: FeatureDefinitions) -> None:
    events, arrivals, _ = _stream(seed, n=600)
    if defs is IDS_DEFS:  # ids: every 7th event re-sent with its id, some beyond the window
        for i, e in enumerate(events):
            e["event_id"] = f"e{i % 150}"
    log = EventLog([orjson.dumps({**e, "_arrival_ms": a})
                    for e, a in zip(events, arrivals, strict=True)] + [b"not json", b"[1, 2]"])
    assert _same(defs, log, _labels(events, arrivals, seed)) > 50


@pytest.mark.slow
def test_columns_equal_the_replay_on_dataframes_of_every_dtype() -> None:
    events, arrivals, _ = _stream(21, n=600)
    rows = [{**e, "_arrival_ms": a} for e, a in zip(events, arrivals, strict=True)]
    labels = _labels(events, arrivals, 21)
    mixed = pd.DataFrame(rows)  # amount holds "12", None and True here and there: object dtype
    assert mixed["amount"].dtype == object
    assert _same(DEFS, mixed, labels) > 50
    clean = [r for r in rows if type(r["amount"]) is float]
    typed = pd.DataFrame(clean)
    assert typed["amount"].dtype == np.float64 and typed["n"].dtype == np.int64
    assert _same(DEFS, typed, labels) > 50
    gaps = typed.copy()
    gaps.loc[::17, "n"] = np.nan  # an int field read as floats: 3.0 is the int 3, NaN is missing
    gaps.loc[::13, "amount"] = np.inf
    gaps.loc[::11, "card_id"] = None
    gaps.loc[5, "n"] = 2.5
    assert gaps["n"].dtype == np.float64
    assert _same(DEFS, gaps, labels) > 50
    for unit in ("s", "ms", "us", "ns"):
        dt = typed.copy()
        dt["ts"] = pd.to_datetime(dt["ts"], unit="ms", utc=True).astype(f"datetime64[{unit}, UTC]")
        assert _same(DEFS, dt, labels) > 50, unit
    naive = typed.copy()
    naive["ts"] = pd.to_datetime(naive["ts"], unit="ms")
    naive.loc[3, "ts"] = pd.NaT
    assert _same(DEFS, naive, labels) > 50
    wrong = typed.copy()
    wrong["card_id"] = np.arange(len(wrong)) % 4  # integer ids are entity "0".."3"
    wrong["flag"] = wrong["flag"].astype(int)  # an int where a bool is due: every event refused
    assert _same(DEFS, wrong.assign(flag=typed["flag"]), labels.assign(
        card_id=labels["card_id"].str[-1])) > 0
    assert _same(DEFS, wrong, labels) == 0
    floats = typed.assign(ts=typed["ts"].astype(float) + 0.5,
                          _arrival_ms=typed["_arrival_ms"].astype(float))
    assert _same(DEFS, floats, labels) > 50


def test_columns_equal_the_replay_on_csv_text(tmp_path: Path) -> None:
    events, arrivals, _ = _stream(31, n=500)
    path = tmp_path / "events.csv"
    pd.DataFrame([{**e, "_arrival_ms": a} for e, a in zip(events, arrivals, strict=True)]).to_csv(
        path, index=False)
    assert _same(DEFS, read_events(path), _labels(events, arrivals, 31)) > 50


def test_ties_of_last_are_broken_like_the_store() -> None:
    """Equal event time and arrival: the stable id decides; an identical event changes nothing."""
    base = {"card_id": "c1", "merchant": "m", "n": 1, "flag": True, "_arrival_ms": T0 + 50}
    rows = [{**base, "ts": T0 + 10, "amount": float(a)} for a in (5, 9, 1, 9, 7, 3)]
    rows += [{**base, "ts": T0 + 10, "amount": 2.0, "_arrival_ms": T0 + 40}]
    # equal times whose arrivals interleave in file order: ties are found after the arrival sort
    rows += [{**base, "ts": T0 + 10, "amount": float(a), "_arrival_ms": T0 + 40 + 10 * (i % 2)}
             for i, a in enumerate((11, 4, 13, 6, 8, 15))]
    labels = pd.DataFrame({"card_id": ["c1", "c1", "c1"], "ts": [T0 + 45, T0 + 50, T0 + 60]})
    _same(DEFS, pd.DataFrame(rows), labels)
    _same(DEFS, pd.DataFrame(rows[::-1]), labels)


def test_events_of_several_sources_split_by_source_equal_the_replay() -> None:
    from redline.features import EventSource, FeatureView, count
    from tests.features.test_training_serving import CARD

    other = EventSource("other", CARD, {"amount": float})
    defs = FeatureDefinitions.of([_view(), FeatureView("o", other, [count("1m")])])
    rows = [{"source": "tx", "card_id": "c1", "amount": 1.0, "merchant": "m", "n": 1,
             "flag": True, "ts": T0}, {"source": "other", "card_id": "c1", "amount": 2.0,
                                       "ts": T0}]
    labels = pd.DataFrame({"card_id": ["c1"], "ts": [T0 + 10]})
    refs = ["v:count_1m", "o:count_1m"]
    cols = build_training_set(defs, pd.DataFrame(rows), labels, refs, method="columns")
    replay = build_training_set(defs, pd.DataFrame(rows), labels, refs, method="replay")
    assert cols["v:count_1m"][0] == cols["o:count_1m"][0] == 1.0
    pd.testing.assert_frame_equal(cols, replay)
    with pytest.raises(InvalidInput, match="replay"):  # a list of dicts still needs the replay
        build_training_set(defs, rows, labels, ["v:count_1m"], method="columns")


def test_overflow_and_empty_windows_by_columns() -> None:
    rows = [{"card_id": "c1", "merchant": "m", "n": 1, "flag": True, "ts": T0 + i,
             "amount": 1e308} for i in range(2)]
    labels = pd.DataFrame({"card_id": ["c1", "c1"], "ts": [T0 + 100, T0 - 1]})
    got = build_training_set(DEFS, pd.DataFrame(rows), labels, method="columns")
    assert got["v:amount_sum_1m"].tolist() == [math.inf, 0.0]
    assert got["v:amount_mean_5m"][0] == 1e308 and got["v:amount_stddev_5m"][0] == 0.0
    assert math.isnan(got["v:amount_mean_5m"][1]) and got["v:n_distinct_5m"][1] == 0.0


def _last_only(src: Any) -> FeatureDefinitions:
    return FeatureDefinitions.of([FeatureView("v", src, [
        last("amount", "5m"), last("n", "5m"), last("flag", "1m"),
        Aggregation("last", "amount", "2m", name="amount_last_2m_30s", tile="30s", default=-1.0),
    ])])


@pytest.mark.parametrize("steps", [0, 1, 8])
@pytest.mark.parametrize("ids", [False, True], ids=["no-ids", "event-ids"])
def test_views_of_only_last_take_the_short_path_and_equal_the_replay(
        monkeypatch: pytest.MonkeyPatch, ids: bool, steps: int) -> None:
    """A window read only by ``last`` finds one position per row, stepping back over events not
    yet arrived (and gathering the rest after ``steps`` steps): equal to the replay."""
    calls: list[int] = []
    real = values.last_arrived
    monkeypatch.setattr(values, "last_arrived", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(last_values, "LAST_STEPS", steps)
    defs = _last_only(IDS if ids else TX)
    events, arrivals, _ = _stream(41 + steps, n=600)
    if ids:  # every 7th event re-sent with its id, some beyond the window
        for i, e in enumerate(events):
            e["event_id"] = f"e{i % 150}"
    # card c9: 12 events whose arrival comes long after their times (late but admitted), and
    # two on one time and arrival (the stable id breaks the tie)
    t9 = T0 + 600_000
    events += [ev(t9 + i, "c9", amount=float(i), n=i, event_id=f"c9-{i}") for i in range(12)]
    arrivals += [t9 + 100_000] * 12
    events += [ev(t9 - 5, "c9", amount=a, event_id=f"t{a}") for a in (3.0, 4.0)]
    arrivals += [t9 - 5] * 2
    rows = pd.DataFrame([{**e, "_arrival_ms": a} for e, a in zip(events, arrivals, strict=True)])
    labels = pd.concat([_labels(events, arrivals, 41), pd.DataFrame({
        "card_id": ["c9"] * 5, "ts": [t9 - 6, t9 - 5, t9 + 20, t9 + 99_999, t9 + 100_000]})],
        ignore_index=True)
    view = defs.view("v")
    refs = [view.ref(f) for f in view.feature_names]
    cols = build_training_set(defs, rows, labels, refs, method="columns")
    ref = build_training_set(defs, rows, labels, refs, method="replay")
    assert calls, "the short path was not taken"
    for r in refs:
        a, b = cols[r].to_numpy(), ref[r].to_numpy()
        bad = ~((a == b) | (np.isnan(a) & np.isnan(b)))
        assert not bad.any(), (r, np.flatnonzero(bad)[:5], a[bad][:5], b[bad][:5])
    assert cols["v:amount_last_5m"].notna().sum() > 50
    c9 = cols["v:amount_last_5m"].tail(5).tolist()
    assert math.isnan(c9[0]) and c9[1] == c9[2] == c9[3] in (3.0, 4.0) and c9[4] == 11.0


@pytest.mark.parametrize("ids", [False, True], ids=["no-ids", "event-ids"])
def test_bisection_inside_entities_equals_the_replay(monkeypatch: pytest.MonkeyPatch,
                                                     ids: bool) -> None:
    """The searches inside each entity's events (taken where entities have few events, as in
    snapshot tables) give the whole-array search's answer: forced on the hostile stream."""
    monkeypatch.setattr(keyed, "SMALL_GROUPS", 10**9)
    defs = IDS_DEFS if ids else DEFS
    events, arrivals, _ = _stream(51, n=600)
    if ids:
        for i, e in enumerate(events):
            e["event_id"] = f"e{i % 150}"
    log = EventLog([orjson.dumps({**e, "_arrival_ms": a})
                    for e, a in zip(events, arrivals, strict=True)])
    assert _same(defs, log, _labels(events, arrivals, 51)) > 50


@pytest.mark.parametrize("small", [0, 3])
def test_snapshot_tables_equal_the_replay(monkeypatch: pytest.MonkeyPatch, small: int) -> None:
    """One or two events per entity (a snapshot table, Feast's shape): bisecting inside the
    entities (the default) and searching the whole array both equal the replay."""
    monkeypatch.setattr(keyed, "SMALL_GROUPS", small)
    rng = random.Random(7)
    rows = []
    for k in range(600):
        for _ in range(rng.choice([1, 1, 2])):
            t = T0 + rng.randrange(600_000)
            rows.append({**ev(t, f"k{k}", amount=rng.uniform(-5, 50), n=rng.randrange(9),
                              merchant=f"m{rng.randrange(40)}"),
                         "_arrival_ms": t + rng.choice([0, 0, 30, 150_000])})
    labels = pd.DataFrame({"card_id": [f"k{rng.randrange(650)}" for _ in range(3000)],
                           "ts": [T0 + rng.randrange(-1000, 700_000) for _ in range(3000)]})
    assert _same(DEFS, pd.DataFrame(rows), labels) > 200
    lasts = _last_only(TX)  # a view read only by last: one position per row
    cols = build_training_set(lasts, pd.DataFrame(rows), labels, method="columns")
    ref = build_training_set(lasts, pd.DataFrame(rows), labels, method="replay")
    pd.testing.assert_frame_equal(cols, ref)
    assert cols["v:amount_last_5m"].notna().sum() > 200


# sparse ids (10**12 apart) do not fit int32 label ids: that pair is not a case
ID_CASES = [(spacing, dtype) for spacing in (1, 10**12 + 7)
            for dtype in ("int64", "int32", "float64", "text") if spacing == 1 or dtype != "int32"]


@pytest.mark.parametrize(("spacing", "label_dtype"), ID_CASES,
                         ids=[f"{'dense' if s == 1 else 'sparse'}-ids-{d}" for s, d in ID_CASES])
def test_one_event_per_integer_entity_equals_the_replay(
        monkeypatch: pytest.MonkeyPatch, spacing: int, label_dtype: str) -> None:
    """A snapshot table keyed by integers (Feast's shape: one row per card): each row's event
    taken straight from its entity's one position, ids met by a table when dense and by a hash
    when not, label ids of any dtype naming the same entities; late, future, missing and
    unnamed entities included. Equal to the replay on every value."""
    calls: list[int] = []
    real = values.SnapshotRows
    monkeypatch.setattr(values, "SnapshotRows", lambda *a: calls.append(1) or real(*a))
    rng = random.Random(5)
    rows = []
    for k in range(500):
        if k % 9 == 0:
            continue  # entities without events
        t = T0 + rng.randrange(600_000)
        rows.append({"card_id": k * spacing, "amount": rng.uniform(-5, 50), "n": rng.randrange(9),
                     "merchant": f"m{k % 7}", "flag": k % 2 == 0, "ts": t,
                     "_arrival_ms": t + rng.choice([0, 0, 30, 150_000, -900, -5000])})
    # entities whose one event came early (its time ahead of its arrival, within the skew), just
    # past a tile's start: read after its arrival but before that tile, it does not count yet
    early = []
    for k in range(500, 520):
        t = T0 + (k - 490) * 60_000 + 200  # every tile size here divides a minute
        rows.append({"card_id": k * spacing, "amount": float(k), "n": k, "merchant": "m0",
                     "flag": True, "ts": t, "_arrival_ms": t - 900})
        early += [(k * spacing, t - 900), (k * spacing, t - 201), (k * spacing, t - 200),
                  (k * spacing, t), (k * spacing, t + 1)]
    frame = pd.DataFrame(rows)
    assert frame["card_id"].dtype == np.int64
    if spacing == 1:  # float32 values (as Parquet holds them) picked as they are
        frame["amount"] = frame["amount"].astype(np.float32)
    ids = [rng.randrange(560) * spacing for _ in range(3000)]  # some name no entity
    times = [T0 + rng.randrange(-1000, 900_000) for _ in range(3000)]
    ids += [k for k, _ in early]
    times += [t for _, t in early]
    label_ids: Any = {"int64": np.array(ids, dtype=np.int64), "float64": np.array(ids, float),
                      "text": [str(i) for i in ids],
                      "int32": np.array(ids, dtype=np.int64).astype(np.int32)}[label_dtype]
    labels = pd.DataFrame({"card_id": label_ids, "ts": times})
    for defs in (_last_only(TX), DEFS):
        view = defs.view("v")
        refs = [view.ref(f) for f in view.feature_names]
        cols = build_training_set(defs, frame, labels, refs, method="columns")
        ref = build_training_set(defs, frame, labels, refs, method="replay")
        exact = defs is not DEFS  # sums and means may differ in the last bits
        pd.testing.assert_frame_equal(cols, ref, check_exact=exact, rtol=1e-9)
        assert cols[refs[0]].notna().sum() > 300
    assert calls, "the snapshot path was not taken"
