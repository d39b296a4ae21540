"""A file replay's tile updates gathered as columns and folded into the memory store in bulk.

:meth:`MemoryStore.write` is the reference: one op at a time, batch by batch. Here the decoder
hands over each accepted event once (``EventDecoder.decode(sink=...)``), and the ops it would
have made are built as numpy columns: tile and ring slot per tile grid, the view's key per
entity. Event ids are deduplicated batch by batch as the reference does. At :meth:`flush` the
ops are grouped by the ring slot they update (key, tile group, slot): the slot ends up holding
the newest tile its ops name (or its own tile, when newer), and the ops of older tiles are
skipped or overwritten, so only the ops of that tile are folded — with the operations of
``NumericTile.update`` in event order, vectorised across the slots, so every record is the
reference's to the last bit. ``tests/features/test_bulk_preload.py`` holds it to that.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.features.aggregates import EMPTY_RECORD
from redline.features.online.base import now_ms

if TYPE_CHECKING:
    from redline.features.online.memory import MemoryStore, _KeyState

FLUSH_OPS = 500_000  # ops held before they are folded (~50 MB of columns)
_COLUMNS = ("key", "gid", "tile", "slot", "ts", "arrival", "sid", "x", "reg", "rank", "seq")


class BulkLoader:
    """Takes decoded batches (``add``) in order, writes their tiles at ``flush``."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.states: list[_KeyState] = []  # the keys the held ops name, by number
        self.numbers: dict[str, int] = {}
        self.held: dict[str, list[np.ndarray]] = {c: [] for c in _COLUMNS}
        self.count = 0

    @staticmethod
    def sink() -> dict[Any, list[Any]]:
        """What ``EventDecoder.decode`` fills for :meth:`add`."""
        return collections.defaultdict(list)

    def add(self, sink: dict[Any, list[Any]], first: int) -> None:
        """The events of one decoded batch (its tags count from ``first`` in the whole replay)."""
        store = self.store
        wall = now_ms()
        store.sweep(wall)
        with store.lock:
            for plan, events in sink.items():
                self._add_plan(plan, events, first, wall)
        if self.count >= FLUSH_OPS:
            self.flush()

    def _key(self, name: str, ttl: int, wall: int) -> int:
        number = self.numbers.get(name)
        st = self.store.state(name)
        if number is None or self.states[number] is not st:  # new, or expired and made again
            number = self.numbers[name] = len(self.states)
            self.states.append(st)
        st.expires = max(st.expires, wall + ttl)
        return number

    def _add_plan(self, plan: Any, events: list[Any], first: int, wall: int) -> None:
        ts_l, ar_l, sid_l, eids, values, tags = zip(*events, strict=True)
        ts = np.array(ts_l, dtype=np.int64)
        ar = np.array(ar_l, dtype=np.int64)
        sid = np.array(sid_l, dtype=np.int64)
        seq = np.array(tags, dtype=np.int64) + first
        lag = ar - ts
        spots = []  # per tile grid: (visible, tile, slot), as ``tiles.place``
        for tile_ms, tiles, ring, horizon in plan.grid_spans:
            tile = ts // tile_ms
            spots.append(((lag < horizon) | (tile >= ar // tile_ms - tiles + 1), tile,
                          tile % ring))
        xs: dict[str, np.ndarray] = {}
        for head, tail, ttl, _, groups in plan.view_ops:
            seen = np.zeros(len(ts), dtype=bool)
            for _, _, _, gi in groups:
                seen |= spots[gi][0]
            rows = np.flatnonzero(seen)
            if not len(rows):
                continue
            # the view's key per event, made in event order (as the reference names them)
            names: dict[str, int] = {}
            keys = np.empty(len(rows), dtype=np.int64)
            for i, r in enumerate(rows.tolist()):
                eid = eids[r]
                k = names.get(eid)
                if k is None:
                    k = names[eid] = self._key(head + eid + tail, ttl, wall)
                keys[i] = k
            if plan.dedup_ms:
                fresh = self._dedup(keys, ar[rows], sid[rows], plan.dedup_ms)
                rows, keys = rows[fresh], keys[fresh]
            for gid, fld, kind, gi in groups:
                visible, tile, slot = spots[gi]
                on = visible[rows]
                at = rows[on]
                if kind == 3:
                    pos = [plan.hll(fld, values[r][fld]) for r in at.tolist()]
                    reg = np.array([p[0] for p in pos], dtype=np.int64)
                    rank = np.array([p[1] for p in pos], dtype=np.int64)
                    x = np.zeros(len(at))
                else:
                    if kind == 0:
                        x = np.zeros(len(at))
                    else:
                        col = xs.get(fld)
                        if col is None:
                            col = xs[fld] = np.array([float(v[fld]) for v in values],
                                                     dtype=np.float64)
                        x = col[at]
                    reg = np.full(len(at), -1, dtype=np.int64)
                    rank = np.zeros(len(at), dtype=np.int64)
                self._hold(key=keys[on], gid=np.full(len(at), gid, dtype=np.int64),
                           tile=tile[at], slot=slot[at], ts=ts[at], arrival=ar[at],
                           sid=sid[at], x=x, reg=reg, rank=rank, seq=seq[at])

    def _hold(self, **cols: np.ndarray) -> None:
        for name, col in cols.items():
            self.held[name].append(col)
        self.count += len(cols["key"])

    def _dedup(self, keys: np.ndarray, arrivals: np.ndarray, sids: np.ndarray, window: int
               ) -> np.ndarray:
        """Which events are not redeliveries, decided and remembered as ``MemoryStore.write``
        does (one decision per event and key; ids older than the window forgotten after the
        batch)."""
        fresh = np.zeros(len(keys), dtype=bool)
        newest: dict[int, int] = {}
        for i, (k, arrival, sid) in enumerate(zip(keys.tolist(), arrivals.tolist(),
                                                  sids.tolist(), strict=True)):
            ids = self.states[k].ids
            seen = ids.get(sid)
            if seen is None or arrival - seen > window:
                fresh[i] = True
                ids[sid] = arrival
                newest[k] = max(newest.get(k, arrival), arrival)
        for k, top in newest.items():
            ids = self.states[k].ids
            cutoff = top - window
            for old in [i for i, a in ids.items() if a < cutoff]:
                del ids[old]
        return fresh

    def flush(self) -> None:
        """Fold the held ops into the store's rings."""
        if not self.count:
            return
        c = {name: np.concatenate(cols) for name, cols in self.held.items()}
        with self.store.lock:
            fold(self.states, c)
            for st in self.states:  # a window a read merged meanwhile is merged again
                st.cache_at = None
        self.held = {name: [] for name in _COLUMNS}
        self.states, self.numbers, self.count = [], {}, 0


def fold(states: list[_KeyState], c: dict[str, np.ndarray]) -> None:
    """Apply ops (columns ``_COLUMNS``, ``key`` numbering ``states``) to the rings."""
    # each slot's ops together, in event order
    order = np.lexsort((c["seq"], c["slot"], c["gid"], c["key"]))
    ks, gs, ss, tiles = (c[name][order] for name in ("key", "gid", "slot", "tile"))
    m = len(order)
    head = np.ones(m, dtype=bool)
    head[1:] = (ks[1:] != ks[:-1]) | (gs[1:] != gs[:-1]) | (ss[1:] != ss[:-1])
    starts = np.flatnonzero(head)
    top = np.maximum.reduceat(tiles, starts)  # the newest tile each slot's ops name
    sizes = np.diff(np.append(starts, m))
    live = tiles == np.repeat(top, sizes)  # the ops of that tile
    distinct = (c["reg"][order[starts]] >= 0).tolist()
    gk, gg, gslot = ks[starts], gs[starts], ss[starts]
    # a ring is grown once to the largest slot its ops name (slots ascend within a ring)
    ring_end = np.ones(len(starts), dtype=bool)
    ring_end[:-1] = (gk[1:] != gk[:-1]) | (gg[1:] != gg[:-1])
    ends = np.flatnonzero(ring_end)
    size_of = np.repeat(gslot[ends] + 1, np.diff(np.append(-1, ends)))
    groups: list[int] = []  # the numeric slots to fold, their ring entries and held records
    entries: list[list[Any]] = []
    helds: list[list[Any] | None] = []
    ring: list[Any] = []
    last_k = last_gid = -1
    for g, (k, gid, slot, t, start, size, hll, needed) in enumerate(zip(
            gk.tolist(), gg.tolist(), gslot.tolist(), top.tolist(), starts.tolist(),
            sizes.tolist(), distinct, size_of.tolist(), strict=True)):
        if k != last_k or gid != last_gid:
            last_k, last_gid = k, gid
            rings = states[k].rings
            ring = rings.get(gid)
            if ring is None:
                ring = rings[gid] = []
            if needed > len(ring):
                ring.extend([None] * (needed - len(ring)))
        entry = ring[slot]
        if entry is not None and entry[0] > t:
            continue  # the slot holds a newer tile: every op of this one is skipped
        held = entry[1] if entry is not None and entry[0] == t else None
        if hll:
            regs = held if held is not None else bytearray(256)
            if held is None:
                ring[slot] = [t, regs]
            ops = order[start:start + size][live[start:start + size]]
            for reg, rank in zip(c["reg"][ops].tolist(), c["rank"][ops].tolist(), strict=True):
                if rank > regs[reg]:
                    regs[reg] = rank
            continue
        if held is None:
            entry = ring[slot] = [t, None]  # its record is set below
        groups.append(g)
        entries.append(entry)
        helds.append(held)
    if groups:
        _fold_numeric(c, order, live, starts, sizes, groups, entries, helds)


def _fold_numeric(c: dict[str, np.ndarray], order: np.ndarray, live: np.ndarray,
                  starts: np.ndarray, sizes: np.ndarray, groups: list[int],
                  entries: list[list[Any]], helds: list[list[Any] | None]) -> None:
    """``NumericTile.update`` of each slot's live ops, one event at a time across the slots:
    each entry's record becomes its held record (a new one when None) with its ops folded in."""
    picked = np.flatnonzero(live)
    owner = np.repeat(np.arange(len(starts)), sizes)[picked]
    wanted = np.array(groups, dtype=np.int64)
    runs = np.searchsorted(owner, wanted, side="left")  # each slot's live ops, one run each
    counts = np.searchsorted(owner, wanted, side="right") - runs
    ops = order[picked]
    # times and ids below 2**53 (``to_ms``'s range, 53-bit ids): exact as doubles
    ts, ar, sid = (c[name][ops].astype(np.float64) for name in ("ts", "arrival", "sid"))
    xs = c["x"][ops]
    rec = np.empty((len(groups), len(EMPTY_RECORD)), dtype=np.float64)
    rec[:] = EMPTY_RECORD
    kept = [i for i, held in enumerate(helds) if held is not None]
    if kept:
        rec[kept] = [helds[i] for i in kept]
    n, s, cc, mu, m2, mn, mx, lt, la, li, _ = rec.T.copy()
    winner = np.full(len(groups), -1, dtype=np.int64)  # the op ``last`` holds (-1: as held)
    with np.errstate(all="ignore"):
        for step in range(int(counts.max())):
            a = np.flatnonzero(counts > step)
            j = runs[a] + step
            x = xs[j]
            na, sa, ca, mua = n[a], s[a], cc[a], mu[a]
            q = (sa + ca) / na
            mean_old = np.where(na != 0, np.where(np.isfinite(q), q, mua), 0.0)
            t = sa + x
            comp = np.where(np.abs(sa) >= np.abs(x), (sa - t) + x, (x - t) + sa)
            ca = np.where(np.isinf(t), ca, ca + comp)
            sa = t
            na = na + 1
            mua = np.where(na == 1, x, mua + (x / na - mua / na))
            q = (sa + ca) / na
            mean_new = np.where(np.isfinite(q), q, mua)
            m2[a] = m2[a] + (x - mean_old) * (x - mean_new)
            n[a], s[a], cc[a], mu[a] = na, sa, ca, mua
            mn[a] = np.where(x < mn[a], x, mn[a])
            mx[a] = np.where(x > mx[a], x, mx[a])
            et, ea, ei = ts[j], ar[j], sid[j]
            ht, ha, hi = lt[a], la[a], li[a]
            wins = (et > ht) | ((et == ht) & ((ea > ha) | ((ea == ha) & (ei > hi))))
            lt[a] = np.where(wins, et, ht)
            la[a] = np.where(wins, ea, ha)
            li[a] = np.where(wins, ei, hi)
            winner[a] = np.where(wins, ops[j], winner[a])
    stats = np.stack([n, s, cc, mu, m2, mn, mx]).T.tolist()
    won = np.maximum(winner, 0)
    # the winning event's own values, as Python ints and floats (as the reference keeps them)
    last = zip(c["ts"][won].tolist(), c["arrival"][won].tolist(), c["sid"][won].tolist(),
               c["x"][won].tolist(), strict=True)
    for entry, held, row, w, tail in zip(entries, helds, stats, winner.tolist(), last,
                                         strict=True):
        if w >= 0:
            row += tail
        else:
            assert held is not None
            row += held[7:]
        if held is None:
            entry[1] = row
        else:
            held[:] = row
