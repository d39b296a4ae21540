"""The events a view reads, found per label row: sorted by (entity, event time), ties in the
store's order (arrival, stable id, first applied), or — for a snapshot table of one event per
entity — found by id without a sort; and the events of each row's range gathered in chunks.
Views of the same events and label rows share these (kept on the ``Decoded``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from redline.features.training.decoded import Decoded
from redline.features.training.ids import LabelIds, stable_argsort

SMALL_GROUPS = 3  # at most this many events per entity: bisect inside entities (2 steps)
CHUNK = 2_000_000  # gathered (row, event) pairs per step: bounds memory on dense windows


def gathered(left: np.ndarray, lengths: np.ndarray, ar: np.ndarray, times: np.ndarray
             ) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """The events of rows ``left[i]`` .. ``left[i] + lengths[i] - 1`` that had arrived by
    ``times[i]``, in chunks of at most ``CHUNK`` gathered events: (the chunk's rows, a slice;
    each event's row in the chunk, ascending; its position)."""
    cum = np.cumsum(lengths)
    r0 = 0
    while r0 < len(left):
        base_n = cum[r0 - 1] if r0 else 0
        r1 = max(r0 + 1, int(np.searchsorted(cum, base_n + CHUNK, side="right")))
        r1 = min(r1, len(left))
        ln = lengths[r0:r1]
        seg = np.repeat(np.arange(r1 - r0), ln)
        offs = np.cumsum(ln) - ln
        pos = np.arange(len(seg)) - offs[seg] + left[r0:r1][seg]
        keep = ar[pos] <= times[r0:r1][seg]
        yield slice(r0, r1), seg[keep], pos[keep]
        r0 = r1


def _key_order(ent: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``np.argsort(key, kind="stable")``, the keys in that order) of keys ordered first by
    entity (``ent``): the events by entity (radix), then by key (a stable sort of runs: a log's
    events of one entity are nearly in time order already)."""
    order = stable_argsort(ent)
    k = key[order]
    if len(k) > 1 and not (k[1:] >= k[:-1]).all():
        by_key = np.argsort(k, kind="stable")
        order, k = order[by_key], k[by_key]
    return order, k


class KeyedEvents:
    """The events a view reads, sorted by one key (entity rank, event time), ties in the store's
    order; and the label ids' entity ranks (-1: no events) that search them."""

    def __init__(self, label_rank: np.ndarray, sel: np.ndarray, ar: np.ndarray, key: np.ndarray,
                 span: int, t_lo: int, uts: np.ndarray | None, starts: np.ndarray,
                 longest: int) -> None:
        self.label_rank, self.sel, self.ar, self.key = label_rank, sel, ar, key
        self.span, self.t_lo, self.uts = span, t_lo, uts
        self.starts = starts  # where each entity rank's events begin (and the end)
        self.longest = longest  # the most events of one entity rank
        self._values: dict[str, np.ndarray] = {}
        self._files: np.ndarray | None = None

    def search(self, qrank: np.ndarray, bound: np.ndarray) -> np.ndarray:
        """``np.searchsorted(key, bound)`` for bounds inside their rows' entity ranges. Where
        every entity has only a few events (a snapshot table: one row per entity), a few
        bisection steps inside each entity's range beat a search of the whole array."""
        if self.longest > SMALL_GROUPS:
            return np.searchsorted(self.key, bound)
        r = np.maximum(qrank, 0)  # a row without events searches an entity's range, unused
        lo, hi = self.starts[r], self.starts[r + 1]
        top = len(self.key) - 1
        for _ in range(self.longest.bit_length()):  # selections by arithmetic: no branches
            mid = (lo + hi) >> 1
            less = (lo < hi) & (self.key[np.minimum(mid, top)] < bound)
            lo = lo + less * (mid + 1 - lo)
            hi = mid + less * (hi - mid)  # an empty range stays empty: mid == lo == hi
        return lo

    def rank(self, bound: np.ndarray) -> np.ndarray:
        """Times as the key's time part: an event's key is below ``base + rank(b)`` exactly
        when its time is below ``b``."""
        if self.uts is not None:
            return np.searchsorted(self.uts, bound)
        return np.clip(bound - self.t_lo, 0, self.span - 1)

    def files(self, dec: Decoded) -> np.ndarray:
        """These events' positions in the input (kept for the next field and view)."""
        if self._files is None:
            self._files = dec.index[self.sel]
        return self._files

    def values(self, dec: Decoded, field: str) -> np.ndarray:
        """A numeric field's values of these events, in their order (kept for the next view)."""
        if field not in self._values:
            self._values[field] = dec.fields[field].take(self.files(dec))
        return self._values[field]

    def reorder(self, order: np.ndarray) -> KeyedEvents:
        return KeyedEvents(self.label_rank, self.sel[order], self.ar[order], self.key[order],
                           self.span, self.t_lo, self.uts, self.starts, self.longest)


def _orders(dec: Decoded, lab: LabelIds, fresh: np.ndarray) -> dict[Any, Any]:
    """What views of the same events, label rows and ``fresh`` share (kept on ``dec``)."""
    cache = dec.orders
    fresh_bytes = fresh.tobytes()
    if cache.get("labels") is not lab or cache.get("fresh") != fresh_bytes:
        cache = dec.orders = {"labels": lab, "fresh": fresh_bytes}
    return cache


def _ranked(dec: Decoded, lab: LabelIds, fresh: np.ndarray, cache: dict[Any, Any], keep: bool
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(:meth:`Decoded.event_ranks`, the admitted events ``fresh`` keeps): where both
    :func:`snapshot_events` and :func:`keyed_events` start, made once. ``keep``: left in
    ``cache`` (:func:`_orders`) for the next; :func:`keyed_events` takes it, its sorted events
    hold the rest."""
    got = cache.pop("ranked", None)
    if got is None:
        got = (*dec.event_ranks(lab), np.flatnonzero(fresh))
    if keep:
        cache["ranked"] = got
    return got  # type: ignore[no-any-return]


def snapshot_events(dec: Decoded, lab: LabelIds, fresh: np.ndarray) -> np.ndarray | None:
    """Per distinct label id, its entity's one event that ``fresh`` keeps (an admitted
    position; -1: none) when no entity has two (a snapshot table: a row per entity, as Feast's
    sources are); else ``None``. Such a table needs no sort: a row's event is found by its id."""
    cache = _orders(dec, lab, fresh)
    if "snapshot" not in cache:
        label_rank, event_rank, sel = _ranked(dec, lab, fresh, cache, keep=True)
        slots = event_rank[sel] + 1  # slot 0: events no label id names
        counts = np.bincount(slots, minlength=len(label_rank) + 1)
        if len(counts) > 1 and int(counts[1:].max()) > 1:
            cache["snapshot"] = None
        else:
            at = np.full(len(label_rank) + 1, -1, dtype=np.int64)
            at[slots] = sel
            cache["snapshot"] = at[1:]
    return cache["snapshot"]  # type: ignore[no-any-return]


def keyed_events(dec: Decoded, lab: LabelIds, fresh: np.ndarray, last: bool) -> KeyedEvents:
    """The sorted events of a view whose key applies ``fresh``; views of the same events and
    label rows share them (kept on ``dec``)."""
    cache = _orders(dec, lab, fresh)
    if last in cache:
        return cache[last]  # type: ignore[no-any-return]
    if "base" not in cache:
        label_rank, event_rank, sel = _ranked(dec, lab, fresh, cache, keep=False)
        ent = event_rank[sel]
        named = np.flatnonzero(ent >= 0)  # entities no row names: no effect
        sel, ent = sel[named], ent[named]
        ts, ar = dec.ts[sel], dec.arrival[sel]
        # the time itself as the key's low part when the product fits in int64, else its rank
        # among the distinct times
        t_lo = int(ts.min()) if len(ts) else 0
        t_span = (int(ts.max()) - t_lo + 2) if len(ts) else 2
        nent = len(label_rank) + 1  # ranks, and -1
        uts = None
        if nent * t_span < 2**62:
            span = t_span
            key = ent * span + (ts - t_lo)
        else:
            uts = np.unique(ts)
            span = len(uts) + 1
            key = ent * span + np.searchsorted(uts, ts)
        order, key = _key_order(ent, key)
        counts = np.bincount(ent, minlength=len(label_rank))
        starts = np.r_[0, np.cumsum(counts)]
        base = cache["base"] = KeyedEvents(label_rank, sel[order], ar[order], key, span, t_lo,
                                           uts, starts,
                                           int(counts.max()) if len(counts) else 0)
        k = base.key
        cache["ties"] = np.flatnonzero(k[1:] == k[:-1])
    base, same = cache["base"], cache["ties"]
    if not len(same):
        cache[last] = base
        return base  # type: ignore[no-any-return]
    # equal (entity, time): by arrival, then stable id (for last), then the first applied
    sel, ar, key = base.sel, base.ar, base.key
    at = np.unique(np.r_[same, same + 1])
    sub = at[np.lexsort((-sel[at], ar[at], key[at]))]
    tie = np.zeros(len(sub), dtype=np.int64)
    if last:  # stable ids only where (entity, time, arrival) are equal
        ks, a_sub = key[sub], ar[sub]
        eq = np.flatnonzero((ks[1:] == ks[:-1]) & (a_sub[1:] == a_sub[:-1]))
        for p in np.unique(np.r_[eq, eq + 1]).tolist():
            tie[p] = dec.stable_id(int(sel[sub[p]]))
    order = np.arange(len(sel))
    order[at] = sub[np.lexsort((-sel[sub], tie, ar[sub], key[sub]))]
    cache[last] = base.reorder(order)
    return cache[last]  # type: ignore[no-any-return]
