"""Aggregates and tile arithmetic: the doctests, merge laws, edges and numeric stability."""

from __future__ import annotations

import doctest
import math
import random

import numpy as np
import pytest

from redline.features import aggregates, tiles
from redline.features.aggregates import (
    EMPTY_RECORD,
    HyperLogLog,
    Stddev,
    Sum,
    record_merge,
    record_update,
    record_value,
)
from redline.features.tiles import TileWindow, default_tile_ms, parse_duration


@pytest.mark.parametrize("module", [aggregates, tiles])
def test_doctests(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted >= 3 and result.failed == 0


def test_records_split_any_way_merge_to_the_one_pass_answer() -> None:
    rng = random.Random(5)
    xs = [rng.uniform(-1e6, 1e6) + 1e9 for _ in range(2000)]
    one = list(EMPTY_RECORD)
    for i, x in enumerate(xs):
        record_update(one, x, i)
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(xs)), 20))
        acc = list(EMPTY_RECORD)
        for lo, hi in zip([0, *cuts], [*cuts, len(xs)], strict=True):
            part = list(EMPTY_RECORD)
            for i in range(lo, hi):
                record_update(part, xs[i], i)
            record_merge(acc, part)
        assert acc[0] == len(xs)
        for kind in ("sum", "mean", "min", "max", "last", "stddev"):
            assert math.isclose(record_value(acc, kind, math.nan),
                                record_value(one, kind, math.nan), rel_tol=1e-9), kind
    assert math.isclose(record_value(one, "stddev", 0), float(np.std(xs)), rel_tol=1e-9)
    assert math.isclose(record_value(one, "mean", 0), math.fsum(xs) / len(xs), rel_tol=1e-15)


def test_compensated_sum_does_not_drift() -> None:
    s = Sum()
    for _ in range(10_000):
        s.update(0.1)
    assert s.get() == math.fsum([0.1] * 10_000)
    assert sum([0.1] * 10_000) != s.get()  # the naive sum does drift


def test_stddev_is_stable_with_a_large_offset() -> None:
    s = Stddev()
    for x in (1e9 + 4, 1e9 + 7, 1e9 + 13, 1e9 + 16):
        s.update(x)
    assert s.get() == pytest.approx(math.sqrt(22.5), rel=1e-12)


def test_empty_record_defaults() -> None:
    rec = list(EMPTY_RECORD)
    assert record_value(rec, "count", -1) == 0 and record_value(rec, "sum", -1) == 0
    for kind in ("mean", "min", "max", "last", "stddev"):
        assert record_value(rec, kind, -1.0) == -1.0


def test_hyperloglog_accuracy_and_merge() -> None:
    a, b = HyperLogLog(), HyperLogLog()
    for i in range(3000):
        (a if i % 2 else b).update(f"user{i}")
    a.merge(b)
    assert abs(a.get() - 3000) / 3000 < 0.15
    small = HyperLogLog()
    for i in range(20):
        small.update(i)
        small.update(i)
    assert abs(small.get() - 20) <= 2  # register collisions: approximate even when small


def test_tile_edges_are_start_inclusive_end_exclusive() -> None:
    w = TileWindow(60_000, 5_000)
    lo, hi = w.covering(120_000)
    assert (lo, hi) == (13, 24)
    assert w.tile_of(lo * 5_000) == lo  # first covered millisecond is in
    assert w.tile_of(lo * 5_000 - 1) == lo - 1  # the one before is out
    assert w.tile_of((hi + 1) * 5_000 - 1) == hi  # last millisecond of the current tile is in
    assert w.covering(-1) == (-12, -1)  # floor division also before 1970


def test_durations_and_default_tiles() -> None:
    assert parse_duration("7d") == 7 * 86_400_000
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("5 minutes")
    for w in ("1m", "5m", "1h", "24h", "7d", "90s"):
        ms = parse_duration(w)
        t = default_tile_ms(ms)
        assert ms % t == 0 and ms // t >= 10
    with pytest.raises(ValueError, match="multiple"):
        TileWindow(60_000, 7_000)
