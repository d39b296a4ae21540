"""One definition of a merge: the Lua partials in Redis equal ``aggregates.NumericTile`` bit for
bit, for any events, any order and any split into tiles (hypothesis)."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redline.features.aggregates import HyperLogLog, NumericTile
from redline.features.online.redis_lua import PARTIALS

DRIVER = PARTIALS + r"""
local unpack_, pack = struct.unpack, struct.pack
local ev, ntiles = ARGV[1], tonumber(ARGV[2])
local E = {0, 0.0, 0.0, 0.0, 0.0, INF, -INF, -INF, -INF, -INF, 0/0}
local tiles = {}
for i = 1, ntiles do tiles[i] = {unpack(E)} end
for pos = 1, #ev, 40 do
  local t, x, ts, ar, id = unpack_('<ddddd', ev, pos)
  local r = tiles[t + 1]
  r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11] =
    upd(r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], x, ts, ar, id)
end
local a = {unpack(E)}
for i = 1, ntiles do
  local r = tiles[i]
  a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11] =
    merge(a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
          r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11])
end
return pack('<ddddddddddd', unpack(a))
"""

values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False),
    st.sampled_from([1e308, -1e308, 1e-300, 5e-324, 0.0, -0.0, 7.0, 1e16, 1.0]),
)
events = st.lists(st.tuples(st.integers(0, 5), values, st.integers(0, 4), st.integers(0, 3),
                            st.integers(0, 2**53 - 1)), min_size=0, max_size=40)


def _python(evs: list[tuple[int, float, int, int, int]], ntiles: int) -> list[float]:
    tiles = [NumericTile() for _ in range(ntiles)]
    for t, x, ts, ar, sid in evs:
        tiles[t].update(x, ts, ar, sid)
    acc = NumericTile()
    for tile in tiles:
        acc.merge(tile)
    return list(acc)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)


@pytest.fixture(scope="module")
def lua(redis_server_module):  # type: ignore[no-untyped-def]
    import redis

    client = redis.Redis.from_url(redis_server_module.url)
    return client.register_script(DRIVER)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(evs=events)
def test_lua_partials_equal_python_bit_for_bit(lua, evs) -> None:  # type: ignore[no-untyped-def]
    ntiles = 6
    blob = b"".join(struct.pack("<ddddd", t, x, ts, ar, sid) for t, x, ts, ar, sid in evs)
    got = struct.unpack("<11d", lua(args=[blob, ntiles]))
    want = _python(evs, ntiles)
    assert all(_same(a, b) for a, b in zip(got, want, strict=True)), (got, want)


@settings(max_examples=60, deadline=None)
@given(evs=events, cut=st.integers(0, 40))
def test_any_split_into_tiles_gives_the_same_statistics(evs, cut) -> None:  # type: ignore[no-untyped-def]
    """Count, min, max and last are exact under any split; sums, means and deviations agree to
    rounding (or are equally infinite)."""
    one = _python([(0, x, ts, ar, sid) for _, x, ts, ar, sid in evs], 1)
    two = _python([(0 if i < cut else 1, x, ts, ar, sid)
                   for i, (_, x, ts, ar, sid) in enumerate(evs)], 2)
    a, b = NumericTile(one), NumericTile(two)
    for kind in ("count", "min", "max", "last"):
        assert _same(a.value(kind, math.nan), b.value(kind, math.nan)), kind
    for kind in ("sum", "mean"):
        x, y = a.value(kind, math.nan), b.value(kind, math.nan)
        if math.isinf(x) or math.isinf(y) or math.isnan(x):
            continue  # an overflowed sum depends on the order of the additions, as in IEEE
        scale = max((abs(v[1]) for v in evs), default=1.0)
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12 * scale * max(len(evs), 1)), kind


@given(st.lists(st.text(max_size=5), max_size=50), st.integers(0, 50))
def test_hyperloglog_merge_is_the_union(items, cut) -> None:  # type: ignore[no-untyped-def]
    whole, left, right = HyperLogLog(), HyperLogLog(), HyperLogLog()
    for i, x in enumerate(items):
        whole.update(x)
        (left if i < cut else right).update(x)
    left.merge(right)
    assert left.registers == whole.registers
