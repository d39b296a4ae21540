"""Windowed aggregates of each label row's gathered events, with the same rules as
``aggregates.NumericTile``: count exact, sum compensated (Neumaier, ``±inf`` once it overflows,
then the running mean for the mean), min/max exact, HyperLogLog registers merged by max and
estimated with the same arithmetic in the same order. Sums, means and standard deviations may
differ from the store's in the last bits (they add the same numbers in another order); every
other output is bit-identical.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from redline.features.training.decoded import Decoded
from redline.features.training.ids import stable_argsort

_POW2 = np.array([2.0 ** -r for r in range(256)])  # exactly hll_estimate's terms


def _neumaier(x: np.ndarray, seg: np.ndarray, starts: np.ndarray, nseg: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per segment, ``aggregates._neumaier`` over its values in order, all segments at once."""
    s = np.zeros(nseg)
    c = np.zeros(nseg)
    if len(x) == 0:
        return s, c
    r = np.arange(len(x)) - starts[seg]
    by_r = stable_argsort(r)  # positions in segments are small: a radix sort
    bounds = np.r_[0, np.cumsum(np.bincount(r))]
    with np.errstate(invalid="ignore", over="ignore"):
        for p in range(len(bounds) - 1):
            ii = by_r[bounds[p]:bounds[p + 1]]
            sg, xv = seg[ii], x[ii]
            sv = s[sg]
            t = sv + xv
            comp = np.where(np.abs(sv) >= np.abs(xv), (sv - t) + xv, (xv - t) + sv)
            c[sg] += np.where(np.isinf(t), 0.0, comp)
            s[sg] = t
    return s, c


class _Linear:
    """``hll_estimate``'s linear-counting branch by the number of zero registers (math.log)."""

    def __init__(self, m: int) -> None:
        self.table = np.array([m * math.log(m / z) if z else math.nan for z in range(m + 1)])


def _distinct(reg: np.ndarray, rank: np.ndarray, seg: np.ndarray, nseg: int) -> np.ndarray:
    """``aggregates.hll_estimate`` of each segment's registers, the same operations in order."""
    m = 256
    flat = np.zeros(m * nseg, dtype=np.uint8)  # register-major: each register's row contiguous
    np.maximum.at(flat, reg * nseg + seg, rank)
    regs = flat.reshape(m, nseg)
    z = np.zeros(nseg)
    zeros = np.zeros(nseg, dtype=np.int64)
    for j in range(m):  # in register order, as hll_estimate adds
        z = z + _POW2[regs[j]]
        zeros += regs[j] == 0
    alpha = 0.7213 / (1.0 + 1.079 / m)
    e = alpha * m * m / z
    lin = _Linear(m).table[zeros]
    return np.where((e <= 2.5 * m) & (zeros > 0), lin, e)


HLL_MEMO_SIZE = 1_000_000
_HLL_MEMO: dict[tuple[str, Any], tuple[int, int]] = {}


def hll_positions(dec: Decoded, field: str, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(register, rank) of each selected event's value: one hash per distinct value, and a
    value met before in this process (another partition) is not hashed again."""
    fld = dec.fields[field]
    idx = dec.index[sel]
    if fld.py is not None:
        codes, uniq = pd.factorize(np.array([fld.py[i] for i in idx.tolist()], dtype=object))
        values = list(uniq)
    else:
        ints = fld.raw if fld.typ == "int" else None
        codes, uniq = pd.factorize(ints[idx] if ints is not None else fld.x[idx])
        conv = {"int": int, "bool": bool}.get(fld.typ, float)
        values = [conv(u) for u in uniq.tolist()]
    typ = dec.plan.types[field]
    memo = _HLL_MEMO
    if len(memo) + len(values) > HLL_MEMO_SIZE:
        memo.clear()
    hll = dec.plan.hll
    pos = []
    for v in values:
        p = memo.get((typ, v))
        if p is None:
            p = memo[(typ, v)] = hll(field, v)
        pos.append(p)
    at = np.asarray(codes, dtype=np.int64)
    return (np.array([p[0] for p in pos], dtype=np.int64)[at],
            np.array([p[1] for p in pos], dtype=np.uint8)[at])


def aggregate(outs: list[Any], nrows: int, seg: np.ndarray, pos: np.ndarray,
              x: np.ndarray | None, hll: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """(rows, len(outs)) values of one window's outputs from each row's events (``seg``: the row
    of each gathered event, ascending; ``pos``: the event, in (time, arrival) order)."""
    res = np.empty((nrows, len(outs)))
    n = np.bincount(seg, minlength=nrows)
    nonempty = n > 0
    starts = np.r_[0, np.cumsum(n)[:-1]]
    kinds = {o.kind for o in outs}
    vals: dict[str, np.ndarray] = {"count": n.astype(np.float64)}
    if x is not None and len(kinds - {"count", "distinct"}):
        xv = x[pos]
        nz = np.flatnonzero(nonempty)
        if kinds & {"sum", "mean", "stddev"}:
            s, c = _neumaier(xv, seg, starts, nrows)
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                vals["sum"] = np.where(nonempty, s + c, 0.0)
                m = (s + c) / n
                mu = np.bincount(seg, weights=xv / n[seg], minlength=nrows)
                mean = np.where(np.isfinite(m), m, mu)
                vals["mean"] = mean
                dev = xv - mean[seg]
                m2 = np.bincount(seg, weights=dev * dev, minlength=nrows)
                vals["stddev"] = np.sqrt(np.maximum(m2, 0.0) / n)
        ends = starts[nz] + n[nz]
        for kind, fn in (("min", np.minimum), ("max", np.maximum)):
            if kind in kinds:
                v = np.full(nrows, np.nan)
                if len(nz):
                    v[nz] = fn.reduceat(xv, starts[nz])
                vals[kind] = v
        if "last" in kinds:
            v = np.full(nrows, np.nan)
            v[nz] = xv[ends - 1]
            vals["last"] = v
    if hll is not None and "distinct" in kinds:
        reg, rank = hll
        est = np.zeros(nrows)
        nz = np.flatnonzero(nonempty)
        if len(nz):
            local = np.searchsorted(nz, seg)
            est[nz] = _distinct(reg[pos], rank[pos], local, len(nz))
        vals["distinct"] = est
    for i, o in enumerate(outs):
        v = vals[o.kind]
        if o.kind in ("count", "sum", "distinct"):
            res[:, i] = v
        else:
            res[:, i] = np.where(nonempty, v, o.default)
    return res
