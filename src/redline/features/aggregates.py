"""Tiny mergeable aggregates (River style): ``update`` a value, ``merge`` a partial, ``get``.

A tile of a window holds partial aggregates; a read merges the tiles it covers. Counts are
integers; sums use Neumaier compensated summation; the variance is Welford's ``m2`` merged with
Chan's formula, so numbers do not drift however events are split into tiles.

The Redis store's Lua code (``online/redis_lua.py``) mirrors :class:`NumericTile` operation for
operation; the skew tests hold the two (and the offline builder) to the same answers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

INF = float("inf")


def _neumaier(s: float, c: float, x: float) -> tuple[float, float]:
    """Add ``x`` to the compensated sum ``(s, c)``."""
    t = s + x
    if abs(s) >= abs(x):
        c += (s - t) + x
    else:
        c += (x - t) + s
    return t, c


class Count:
    """Number of events.

    >>> c = Count()
    >>> for _ in range(3): c.update()
    >>> d = Count(); d.update(); c.merge(d); c.get()
    4
    """

    def __init__(self) -> None:
        self.n = 0

    def update(self, x: Any = None) -> None:
        self.n += 1

    def merge(self, other: Count) -> None:
        self.n += other.n

    def get(self) -> int:
        return self.n


class Sum:
    """Compensated (Neumaier) sum: no drift where a naive float sum loses digits.

    >>> s = Sum()
    >>> for x in (1e16, 1.0, -1e16): s.update(x)
    >>> s.get()
    1.0
    """

    def __init__(self) -> None:
        self.s = 0.0
        self.c = 0.0

    def update(self, x: float) -> None:
        self.s, self.c = _neumaier(self.s, self.c, x)

    def merge(self, other: Sum) -> None:
        self.s, self.c = _neumaier(self.s, self.c, other.s)
        self.s, self.c = _neumaier(self.s, self.c, other.c)

    def get(self) -> float:
        return self.s + self.c


class Mean:
    """Arithmetic mean as (count, compensated sum); NaN when empty.

    >>> m = Mean()
    >>> for x in (1.0, 2.0, 6.0): m.update(x)
    >>> m.get()
    3.0
    """

    def __init__(self) -> None:
        self.n = 0
        self.sum = Sum()

    def update(self, x: float) -> None:
        self.n += 1
        self.sum.update(x)

    def merge(self, other: Mean) -> None:
        self.n += other.n
        self.sum.merge(other.sum)

    def get(self) -> float:
        return self.sum.get() / self.n if self.n else math.nan


class Min:
    """Smallest value; NaN when empty.

    >>> m = Min(); m.update(3.0); m.update(-2.0); m.get()
    -2.0
    """

    def __init__(self) -> None:
        self.v = INF

    def update(self, x: float) -> None:
        if x < self.v:
            self.v = x

    def merge(self, other: Min) -> None:
        self.update(other.v)

    def get(self) -> float:
        return self.v if self.v != INF else math.nan


class Max:
    """Largest value; NaN when empty.

    >>> m = Max(); m.update(3.0); m.update(-2.0); m.get()
    3.0
    """

    def __init__(self) -> None:
        self.v = -INF

    def update(self, x: float) -> None:
        if x > self.v:
            self.v = x

    def merge(self, other: Max) -> None:
        self.update(other.v)

    def get(self) -> float:
        return self.v if self.v != -INF else math.nan


class Last:
    """Value with the latest event time; on equal times the later arrival wins.

    >>> last = Last(); last.update(5.0, ts=20); last.update(7.0, ts=10); last.get()
    5.0
    """

    def __init__(self) -> None:
        self.ts = -INF
        self.v = math.nan

    def update(self, x: float, ts: float) -> None:
        if ts >= self.ts:
            self.ts, self.v = ts, x

    def merge(self, other: Last) -> None:
        # Partials merge in tile order; a tie in time can only come from one tile, already resolved.
        if other.ts > self.ts:
            self.ts, self.v = other.ts, other.v

    def get(self) -> float:
        return self.v


class Stddev:
    """Population standard deviation (ddof=0): Welford's m2, partials merged with Chan's formula.

    >>> s = Stddev()
    >>> for x in (2.0, 4.0, 4.0, 4.0): s.update(x)
    >>> t = Stddev()
    >>> for x in (5.0, 5.0, 7.0, 9.0): t.update(x)
    >>> s.merge(t); s.get()
    2.0
    """

    def __init__(self) -> None:
        self.n = 0
        self.sum = Sum()
        self.m2 = 0.0

    def update(self, x: float) -> None:
        mean_old = self.sum.get() / self.n if self.n else 0.0
        self.sum.update(x)
        self.n += 1
        self.m2 += (x - mean_old) * (x - self.sum.get() / self.n)

    def merge(self, other: Stddev) -> None:
        if other.n == 0:
            return
        if self.n == 0:
            self.n, self.m2 = other.n, other.m2
            self.sum.s, self.sum.c = other.sum.s, other.sum.c
            return
        n = self.n + other.n
        delta = other.sum.get() / other.n - self.sum.get() / self.n
        self.m2 = self.m2 + other.m2 + delta * delta * self.n * other.n / n
        self.n = n
        self.sum.merge(other.sum)

    def get(self) -> float:
        return math.sqrt(max(self.m2, 0.0) / self.n) if self.n else math.nan


HLL_PRECISION = 8


def hll_hash(value: Any) -> int:
    """Stable 64-bit hash of a value's text (Python's ``hash`` differs between processes)."""
    data = value if isinstance(value, bytes) else str(value).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def hll_position(value: Any, p: int = HLL_PRECISION) -> tuple[int, int]:
    """(register, rank) of a value: low ``p`` bits pick the register, the rest give the rank."""
    h = hll_hash(value)
    w = h >> p
    return h & ((1 << p) - 1), (64 - p) - w.bit_length() + 1


def hll_estimate(registers: Iterable[int], m: int) -> float:
    """HyperLogLog estimate with linear counting below 2.5·m (the sum runs in register order)."""
    z = 0.0
    zeros = 0
    for r in registers:
        z += 2.0 ** -r
        if r == 0:
            zeros += 1
    alpha = 0.7213 / (1.0 + 1.079 / m)
    e = alpha * m * m / z
    if e <= 2.5 * m and zeros > 0:
        return m * math.log(m / zeros)
    return e


class HyperLogLog:
    """Approximate distinct count: ``2**p`` one-byte registers (p=8: 256 B; ~6.5 % standard error,
    a few % below ~200 where linear counting applies); merge is the register-wise max.

    >>> h = HyperLogLog()
    >>> for x in ["a", "b", "c", "a"]: h.update(x)
    >>> round(h.get())
    3
    """

    def __init__(self, p: int = HLL_PRECISION) -> None:
        self.p = p
        self.registers = bytearray(1 << p)

    def update(self, x: Any) -> None:
        reg, rank = hll_position(x, self.p)
        if rank > self.registers[reg]:
            self.registers[reg] = rank

    def merge(self, other: HyperLogLog) -> None:
        regs = self.registers
        for i, r in enumerate(other.registers):
            if r > regs[i]:
                regs[i] = r

    def get(self) -> float:
        return hll_estimate(self.registers, len(self.registers))


# Layout of one numeric tile record, shared by the memory store, the Redis Lua code and tests.
N, S, C, M2, MN, MX, LT, LV = range(8)
RECORD_LEN = 8
EMPTY_RECORD = (0.0, 0.0, 0.0, 0.0, INF, -INF, -INF, math.nan)


def record_update(rec: list[float], x: float, ts: float) -> None:
    """Fold one value into a tile record in place (the Lua ``upd`` does the same, step by step)."""
    n = rec[N]
    s = rec[S]
    c = rec[C]
    mean_old = (s + c) / n if n else 0.0
    t = s + x
    if abs(s) >= abs(x):
        c += (s - t) + x
    else:
        c += (x - t) + s
    n += 1
    rec[N], rec[S], rec[C] = n, t, c
    rec[M2] += (x - mean_old) * (x - (t + c) / n)
    if x < rec[MN]:
        rec[MN] = x
    if x > rec[MX]:
        rec[MX] = x
    if ts >= rec[LT]:
        rec[LT], rec[LV] = ts, x


def record_merge(acc: list[float], rec: Any) -> None:
    """Merge tile record ``rec`` into ``acc`` in place (Chan for m2, Neumaier for the sum)."""
    nb = rec[N]
    if nb == 0:
        return
    na = acc[N]
    if na == 0:
        acc[:] = list(rec)
        return
    n = na + nb
    delta = (rec[S] + rec[C]) / nb - (acc[S] + acc[C]) / na
    acc[M2] = acc[M2] + rec[M2] + delta * delta * na * nb / n
    acc[N] = n
    s, c = _neumaier(acc[S], acc[C], rec[S])
    acc[S], acc[C] = _neumaier(s, c, rec[C])
    if rec[MN] < acc[MN]:
        acc[MN] = rec[MN]
    if rec[MX] > acc[MX]:
        acc[MX] = rec[MX]
    if rec[LT] > acc[LT]:
        acc[LT], acc[LV] = rec[LT], rec[LV]


def record_value(rec: Any, kind: str, default: float) -> float:
    """The value of aggregation ``kind`` from a merged record; ``default`` when it has no events."""
    n = rec[N]
    if kind == "count":
        return float(n)
    if kind == "sum":
        return rec[S] + rec[C] if n else 0.0
    if n == 0:
        return default
    if kind == "mean":
        return (rec[S] + rec[C]) / n
    if kind == "min":
        return float(rec[MN])
    if kind == "max":
        return float(rec[MX])
    if kind == "last":
        return float(rec[LV])
    if kind == "stddev":
        return math.sqrt(max(rec[M2], 0.0) / n)
    raise ValueError(f"unknown aggregation {kind!r}")
