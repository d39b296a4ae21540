"""Skew proof: online answers (memory and Redis) equal the offline builder's, row for row."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from redline.features import MemoryStore
from redline.features.offline import build_training_set, isclose
from tests.features.streams import definitions, event_stream, replay_and_query


def _compare(reads, defs, events) -> dict[str, int]:
    view = defs.view("card_tx")
    labels = pd.DataFrame({"card_id": [r[0] for r in reads], "ts": [r[1] for r in reads]})
    offline = build_training_set(defs, pd.DataFrame(events), labels,
                                 [view.ref(f) for f in view.feature_names])
    mismatches: dict[str, int] = {}
    kinds = {o.name: o.kind for o in view.layout().outputs}
    for j, name in enumerate(view.feature_names):
        off = offline[view.ref(name)].to_numpy()
        for i, (_card, _t, row) in enumerate(reads):
            a, b = float(row[j]), float(off[i])
            same = (a == b) if kinds[name] == "count" else isclose(a, b)
            if not same:
                mismatches[name] = mismatches.get(name, 0) + 1
    return mismatches


@pytest.mark.parametrize("seed", [1, 2])
def test_memory_store_equals_offline(seed: int) -> None:
    defs = definitions()
    events = event_stream(seed)
    reads = replay_and_query(MemoryStore(), defs, events, seed)
    assert len(reads) >= 150
    # the stream really exercises the edges: late and future events, empty windows
    assert sum(1 for r in reads if r[2][0] == 0) > 10
    assert _compare(reads, defs, events) == {}


def test_redis_store_equals_offline_and_memory(redis_server) -> None:
    from redline.features.online.redis import RedisStore

    defs = definitions()
    events = event_stream(7)
    mem = replay_and_query(MemoryStore(), defs, events, 7)
    red = replay_and_query(RedisStore(redis_server.url), defs, events, 7)
    assert _compare(red, defs, events) == {}
    for (c1, t1, r1), (c2, t2, r2) in zip(mem, red, strict=True):
        assert (c1, t1) == (c2, t2)
        assert all(isclose(float(a), float(b)) for a, b in zip(r1, r2, strict=True))


def test_skew_check_catches_a_wrong_value() -> None:
    """The comparison is not vacuous: a perturbed online value is reported."""
    defs = definitions()
    events = event_stream(3, n=400)
    reads = replay_and_query(MemoryStore(), defs, events, 3)
    card, t, row = reads[-1]
    row = np.array(row)
    row[0] += 1
    reads[-1] = (card, t, row)
    assert _compare(reads, defs, events) == {"count_1m": 1}
    assert not math.isnan(row[0])
