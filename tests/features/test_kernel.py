"""The per-partition kernel: building entity partitions apart, in any row order (with ``_seq``),
gives exactly the in-memory training set, on hostile streams (late, out-of-order, tied and
duplicate events)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from redline.errors import InvalidInput
from redline.features.kernel import SEQ, build_partition
from redline.features.offline import build_training_set
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
