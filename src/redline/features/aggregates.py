"""Tiny mergeable aggregates (River style): ``update`` a value, ``merge`` a partial, ``get``.

A tile of a window holds partial aggregates; a read merges the tiles it covers. Counts are
integers; sums use Neumaier compensated summation; the variance is Welford's ``m2`` merged with
Chan's formula, so numbers do not drift however events are split into tiles.

This module is the one definition of a merge in Python: :class:`NumericTile` (the record a tile
keeps: count, sum, mean, m2, min, max, last) is built from the same primitives as the single
statistics below, and both the memory store and the offline builder run it. The Redis store's Lua
(``online/redis_lua.py``) and the memory store's bulk preload (``online/bulk.py``, the update
vectorised) are the only other implementations; a hypothesis property test
(``tests/features/test_merge_property.py``) and ``tests/features/test_bulk_preload.py`` hold them
to this one.

Overflow follows IEEE double arithmetic in event order: a sum beyond the double range is
``±inf`` (its compensation is not allowed to turn it into NaN), and the mean then comes from a
running mean that cannot overflow (two events of 1e308: sum inf, mean 1e308, stddev 0).

``last`` picks the event with the greatest (event time, arrival time, stable id): a total order,
so the answer does not depend on the order in which updates or tiles are applied.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from typing import Any

INF = float("inf")


def _neumaier(s: float, c: float, x: float) -> tuple[float, float]:
    """Add ``x`` to the compensated sum ``(s, c)``; once ``s`` leaves the double range it stays
    ``±inf`` and the compensation is left alone (``(s - t) + x`` would be NaN)."""
    t = s + x
    if t == INF or t == -INF:
        return t, c
    if abs(s) >= abs(x):
        c += (s - t) + x
    else:
        c += (x - t) + s
    return t, c


def _mean_of(n: float, s: float, c: float, mu: float) -> float:
    """The mean of a partial: the compensated sum over n, or the running mean when the sum
    overflowed (``mu`` is a convex combination of the values, so it is always finite)."""
    m = (s + c) / n
    if m == INF or m == -INF or m != m:
        return mu
    return m


def _running_mean(mu: float, n: float, x: float) -> float:
    """``mu`` after the ``n``-th value ``x``; each term is at most the largest value."""
    return x if n == 1 else mu + (x / n - mu / n)


def _last_wins(ts: float, ar: float, sid: float, lt: float, la: float, li: float) -> bool:
    """Does (ts, arrival, stable id) come after the held (lt, la, li)? The tie rule of ``last``."""
    return ts > lt or (ts == lt and (ar > la or (ar == la and sid > li)))


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

    def revert(self, x: Any = None) -> None:
        self.n -= 1

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
    >>> big = Sum(); big.update(1e308); big.update(1e308); big.get()
    inf
    """

    def __init__(self) -> None:
        self.s = 0.0
        self.c = 0.0

    def update(self, x: float) -> None:
        self.s, self.c = _neumaier(self.s, self.c, x)

    def revert(self, x: float) -> None:
        self.update(-x)

    def merge(self, other: Sum) -> None:
        self.s, self.c = _neumaier(self.s, self.c, other.s)
        self.s, self.c = _neumaier(self.s, self.c, other.c)

    def get(self) -> float:
        return self.s + self.c


class Mean:
    """Arithmetic mean as (count, compensated sum, running mean); NaN when empty.

    >>> m = Mean()
    >>> for x in (1.0, 2.0, 6.0): m.update(x)
    >>> m.get()
    3.0
    >>> big = Mean(); big.update(1e308); big.update(1e308); big.get()
    1e+308
    """

    def __init__(self) -> None:
        self.n = 0
        self.sum = Sum()
        self.mu = 0.0

    def update(self, x: float) -> None:
        self.n += 1
        self.sum.update(x)
        self.mu = _running_mean(self.mu, self.n, x)

    def merge(self, other: Mean) -> None:
        if other.n == 0:
            return
        n = self.n + other.n
        self.mu = self.mu * (self.n / n) + other.mu * (other.n / n)
        self.n = n
        self.sum.merge(other.sum)

    def get(self) -> float:
        return _mean_of(self.n, self.sum.s, self.sum.c, self.mu) if self.n else math.nan


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
    """Value of the event with the greatest (event time, arrival, stable id); NaN when empty.

    >>> last = Last(); last.update(5.0, ts=20); last.update(7.0, ts=10); last.get()
    5.0
    >>> tie = Last(); tie.update(1.0, ts=5, arrival=9); tie.update(2.0, ts=5, arrival=8); tie.get()
    1.0
    """

    def __init__(self) -> None:
        self.ts = -INF
        self.arrival = -INF
        self.sid = -INF
        self.v = math.nan

    def update(self, x: float, ts: float, arrival: float = 0.0, sid: float = 0.0) -> None:
        if _last_wins(ts, arrival, sid, self.ts, self.arrival, self.sid):
            self.ts, self.arrival, self.sid, self.v = ts, arrival, sid, x

    def merge(self, other: Last) -> None:
        self.update(other.v, other.ts, other.arrival, other.sid)

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
        self.tile = NumericTile()

    def update(self, x: float) -> None:
        self.tile.update(x, 0.0)

    def merge(self, other: Stddev) -> None:
        self.tile.merge(other.tile)

    def get(self) -> float:
        return self.tile.value("stddev", math.nan)


HLL_PRECISION = 8


def value_identity(value: Any, typ: str | None = None) -> bytes:
    """What a distinct count counts, defined once per field type and hashed the same everywhere.

    ``int`` fields count integers (``3`` and ``3.0`` are one value, ``"3"``), ``float`` fields
    count doubles by their shortest repr (``3`` and ``3.0`` are one value, ``"3.0"``), ``bool``
    fields ``true``/``false``, ``str`` fields the text. The decoder has already coerced a value to
    its field's type, so one field never mixes representations.

    >>> value_identity(3, "int"), value_identity(3.0, "float"), value_identity(True, "bool")
    (b'3', b'3.0', b'true')
    """
    if typ is None:
        typ = {bool: "bool", int: "int", float: "float"}.get(type(value), "str")
    if typ == "bool":
        return b"true" if value else b"false"
    if typ == "int":
        return str(int(value)).encode()
    if typ == "float":
        return repr(float(value)).encode()
    return value if isinstance(value, bytes) else str(value).encode()


def hll_hash(identity: bytes) -> int:
    """Stable 64-bit hash of a value's identity (Python's ``hash`` differs between processes)."""
    return int.from_bytes(hashlib.blake2b(identity, digest_size=8).digest(), "little")


def hll_position(value: Any, p: int = HLL_PRECISION, typ: str | None = None) -> tuple[int, int]:
    """(register, rank) of a value: low ``p`` bits pick the register, the rest give the rank."""
    h = hll_hash(value_identity(value, typ))
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

    def update(self, x: Any, typ: str | None = None) -> None:
        self.add(*hll_position(x, self.p, typ))

    def add(self, reg: int, rank: int) -> None:
        if rank > self.registers[reg]:
            self.registers[reg] = rank

    def merge(self, other: HyperLogLog) -> None:
        regs = self.registers
        for i, r in enumerate(other.registers):
            if r > regs[i]:
                regs[i] = r

    def get(self) -> float:
        return hll_estimate(self.registers, len(self.registers))


# Layout of one numeric tile record, shared by the memory store, the Redis Lua code and tests:
# count, compensated sum (s, c), running mean, Welford m2, min, max, and last as
# (event time, arrival, stable id, value).
N, S, C, MU, M2, MN, MX, LT, LA, LI, LV = range(11)
RECORD_LEN = 11
EMPTY_RECORD = (0.0, 0.0, 0.0, 0.0, 0.0, INF, -INF, -INF, -INF, -INF, math.nan)


class NumericTile(list):  # type: ignore[type-arg]
    """The partial aggregate of one tile (or of a merged window): every numeric statistic at once,
    as a flat list of :data:`RECORD_LEN` doubles in the layout the Lua code packs.

    >>> a, b = NumericTile(), NumericTile()
    >>> for i, x in enumerate((2.0, 4.0, 4.0, 4.0)): a.update(x, ts=i)
    >>> for i, x in enumerate((5.0, 5.0, 7.0, 9.0)): b.update(x, ts=10 + i)
    >>> a.merge(b); [a.value(k, math.nan) for k in ("count", "sum", "mean", "stddev", "last")]
    [8.0, 40.0, 5.0, 2.0, 9.0]
    """

    __slots__ = ()

    def __init__(self, rec: Iterable[float] = EMPTY_RECORD) -> None:
        super().__init__(rec)

    def update(self, x: float, ts: float, arrival: float = 0.0, sid: float = 0.0) -> None:
        """Fold one event in (the Lua ``upd`` does the same, step by step).

        ``_mean_of``, ``_neumaier``, ``_running_mean`` and ``_last_wins`` written out, the same
        operations in the same order: this runs once per event and view at every ingest and
        start-up replay, where the calls were a third of its time."""
        n, s, c, mu, m2, mn, mx, lt, la, li, lv = self
        if n:
            mean_old = (s + c) / n
            if mean_old == INF or mean_old == -INF or mean_old != mean_old:
                mean_old = mu
        else:
            mean_old = 0.0
        t = s + x
        if t != INF and t != -INF:
            if abs(s) >= abs(x):
                c += (s - t) + x
            else:
                c += (x - t) + s
        s = t
        n += 1
        mu = x if n == 1 else mu + (x / n - mu / n)
        mean_new = (s + c) / n
        if mean_new == INF or mean_new == -INF or mean_new != mean_new:
            mean_new = mu
        m2 += (x - mean_old) * (x - mean_new)
        if x < mn:
            mn = x
        if x > mx:
            mx = x
        if ts > lt or (ts == lt and (arrival > la or (arrival == la and sid > li))):
            lt, la, li, lv = ts, arrival, sid, x
        self[:] = (n, s, c, mu, m2, mn, mx, lt, la, li, lv)

    def merge(self, rec: Any) -> None:
        """Merge another partial in (Chan for m2, Neumaier for the sum; the Lua ``merge``)."""
        nb = rec[N]
        if nb == 0:
            return
        na = self[N]
        if na == 0:
            self[:] = rec
            return
        n = na + nb
        delta = _mean_of(nb, rec[S], rec[C], rec[MU]) - _mean_of(na, self[S], self[C], self[MU])
        self[M2] = self[M2] + rec[M2] + delta * delta * na * nb / n
        self[MU] = self[MU] * (na / n) + rec[MU] * (nb / n)
        self[N] = n
        s, c = _neumaier(self[S], self[C], rec[S])
        self[S], self[C] = _neumaier(s, c, rec[C])
        if rec[MN] < self[MN]:
            self[MN] = rec[MN]
        if rec[MX] > self[MX]:
            self[MX] = rec[MX]
        if _last_wins(rec[LT], rec[LA], rec[LI], self[LT], self[LA], self[LI]):
            self[LT], self[LA], self[LI], self[LV] = rec[LT], rec[LA], rec[LI], rec[LV]

    def value(self, kind: str, default: float) -> float:
        """Aggregation ``kind`` of this partial; ``default`` when it holds no events."""
        return record_value(self, kind, default)


# :meth:`NumericTile.update` itself, on a plain list record ``(rec, x, ts, arrival=0.0,
# sid=0.0)``: no wrapper call between, and on an exact list the interpreter unpacks and assigns
# in its fast path, which makes each update twice as fast as on the subclass (the memory store's
# rings keep plain lists; a start-up replay is mostly updates).
record_update: Callable[..., None] = NumericTile.update


def record_merge(acc: list[float], rec: Any) -> None:
    """:meth:`NumericTile.merge` on a plain list record."""
    NumericTile.merge(acc, rec)  # type: ignore[arg-type]


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
        return _mean_of(n, rec[S], rec[C], rec[MU])
    if kind == "min":
        return float(rec[MN])
    if kind == "max":
        return float(rec[MX])
    if kind == "last":
        return float(rec[LV])
    if kind == "stddev":
        return math.sqrt(max(rec[M2], 0.0) / n)
    raise ValueError(f"unknown aggregation {kind!r}")
