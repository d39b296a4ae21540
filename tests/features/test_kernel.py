"""The per-partition kernel: building entity partitions apart, in any row order (with ``_seq``),
gives exactly the in-memory training set, on hostile streams (late, out-of-order, tied and
duplicate events)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from redline.errors import InvalidInput
from redline.features.offline import build_training_set
from redline.features.training.kernel import SEQ, build_partition
from tests.features.test_asof import _labels
from tests.features.test_training_serving import DEFS, IDS_DEFS, _stream


def _frame(seed: int, ids: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    events, arrivals, _ = _stream(seed, n=600)
    if ids:
        for i, e in enumerate(events):
            e["event_id"] = f"e{i % 150}"
    rows = [{**e, "_arrival_ms": a} for e, a in zip(events, arrivals, strict=True)]
    return pd.DataFrame(rows), _labels(events, arrivals, seed)


@pytest.mark.parametrize("ids", [False, True], ids=["no-ids", "event-ids"])
def test_partitions_built_apart_in_any_order_equal_the_whole(ids: bool) -> None:
    defs = IDS_DEFS if ids else DEFS
    events, labels = _frame(41, ids)
    whole = build_training_set(defs, events, labels)
    rng = np.random.default_rng(5)
    part_of = {"c0": 0, "c1": 1, "c2": 0, "c3": 2, "nobody": 1}
    ev_part = events["card_id"].map(part_of).fillna(0).to_numpy()
    lab = labels.assign(_row=np.arange(len(labels)))
    got = []
    for p in range(3):
        evs = events[ev_part == p].assign(**{SEQ: np.flatnonzero(ev_part == p)})
        evs = evs.iloc[rng.permutation(len(evs))]  # a shuffle: _seq restores the log order
        mine = lab[lab["card_id"].map(part_of).to_numpy() == p]
        got.append(build_partition(defs, evs, mine.iloc[rng.permutation(len(mine))]))
    out = pd.concat(got).sort_values("_row").drop(columns="_row").reset_index(drop=True)
    pd.testing.assert_frame_equal(out, whole)
    assert (whole["v:count_1m"] > 0).sum() > 50


def test_time_in_seconds_is_refused_with_the_fix() -> None:
    events, labels = _frame(3, False)
    with pytest.raises(InvalidInput, match="multiply the column by 1000"):
        build_partition(DEFS, events, labels.assign(ts=labels["ts"] // 1000))


def test_frames_per_source_equal_one_frame_with_a_source_column() -> None:
    from redline.features import EventSource, FeatureDefinitions, FeatureView, count, last
    from tests.features.test_training_serving import CARD, _view

    other = EventSource("other", CARD, {"amount": float})
    defs = FeatureDefinitions.of([_view(), FeatureView("o", other, [count("1m"),
                                                                    last("amount", "5m")])])
    tx, labels = _frame(43, False)
    rng = np.random.default_rng(2)
    oth = pd.DataFrame({"card_id": rng.choice(["c0", "c1", "c2"], 300),
                        "amount": rng.standard_normal(300),
                        "ts": np.sort(rng.choice(labels["ts"].to_numpy(), 300)) - 5})
    one = pd.concat([tx.assign(source="tx"), oth.assign(source="other")], ignore_index=True)
    per = build_training_set(defs, {"tx": tx, "other": oth}, labels, threads=2)
    pd.testing.assert_frame_equal(per, build_training_set(defs, one, labels, threads=2))
    pd.testing.assert_frame_equal(per, build_training_set(defs, one, labels, threads=1))
    replay = build_training_set(defs, {"tx": tx, "other": oth}, labels, method="replay")
    for ref in ("o:count_1m", "o:amount_last_5m", "v:count_1m", "v:amount_last_5m"):
        pd.testing.assert_series_equal(per[ref], replay[ref])
    assert (per["o:count_1m"] > 0).sum() > 50
    alone = build_training_set(defs, {"tx": tx}, labels)  # a source without events: defaults
    assert (alone["o:count_1m"] == 0).all() and alone["o:amount_last_5m"].isna().all()
    pd.testing.assert_series_equal(alone["v:amount_sum_1m"], per["v:amount_sum_1m"])


def test_label_ids_of_every_dtype_meet_their_events() -> None:
    """Integer, whole-float (with a gap), text and mixed label ids find the same entities as
    the event-by-event replay, against integer and text event ids."""
    tx, labels = _frame(44, False)
    nums = {"c0": 7, "c1": 42, "c2": -3, "c3": 2**40}
    as_int = tx.assign(card_id=tx["card_id"].map(nums))
    as_text = tx.assign(card_id=tx["card_id"].map(lambda c: str(nums[c])))
    ids = labels["card_id"].map(nums)  # "nobody": NaN
    refs = ["v:count_1m", "v:amount_last_5m"]
    # the same entities named by text ("42"; ties of last hash the id's text)
    want = build_training_set(DEFS, as_text, labels.assign(card_id=ids.map(
        lambda v: "nobody" if np.isnan(v) else str(int(v)))), refs)
    pd.testing.assert_series_equal(want["v:count_1m"], build_training_set(
        DEFS, tx, labels, refs)["v:count_1m"])
    for label_ids in (ids.fillna(99).astype(np.int64), ids, ids.map(
            lambda v: "99" if np.isnan(v) else str(int(v))), ids.map(
            lambda v: None if np.isnan(v) else int(v) if v > 0 else str(int(v)))):
        lab = labels.assign(card_id=label_ids)
        for events in (as_int, as_text):
            got = build_training_set(DEFS, events, lab, refs)
            pd.testing.assert_frame_equal(got, build_training_set(DEFS, events, lab, refs,
                                                                  method="replay"))
            pd.testing.assert_frame_equal(got[refs], want[refs])
