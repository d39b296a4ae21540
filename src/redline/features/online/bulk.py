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
import threading
from typing import Any, Protocol

import numpy as np

from redline.features.aggregates import EMPTY_RECORD
from redline.features.online.base import now_ms
from redline.features.online.keystate import KeyState


class KeyedTiles(Protocol):
    """What the bulk loader needs of the memory store: its lock, its sweep and a key's state."""

    lock: threading.Lock

    def sweep(self, wall_ms: int) -> None: ...

    def state(self, key: str) -> KeyState: ...

FLUSH_OPS = 500_000  # ops held before they are folded (~50 MB of columns)
_COLUMNS = ("key", "gid", "tile", "slot", "ts", "arrival", "sid", "x", "reg", "rank")


class BulkLoader:
    """Takes decoded batches (``add``) in order, writes their tiles at ``flush``."""

    def __init__(self, store: KeyedTiles) -> None:
        self.store = store
        self.states: list[KeyState] = []  # the keys the held ops name, by number
        self.numbers: dict[str, int] = {}
        self.held: dict[str, list[np.ndarray]] = {c: [] for c in _COLUMNS}
        self.count = 0

    @staticmethod
    def sink() -> dict[Any, list[Any]]:
        """What ``EventDecoder.decode`` fills for :meth:`add`."""
        return collections.defaultdict(list)

    def add(self, sink: dict[Any, list[Any]]) -> None:
        """The events of one decoded batch; batches come in replay order."""
        store = self.store
        wall = now_ms()
        store.sweep(wall)
        with store.lock:
            for plan, events in sink.items():
                self._add_plan(plan, events, wall)
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

    def _add_plan(self, plan: Any, events: list[Any], wall: int) -> None:
        ts_l, ar_l, sid_l, eids, values = zip(*events, strict=True)
        ts = np.array(ts_l, dtype=np.int64)
        ar = np.array(ar_l, dtype=np.int64)
        sid = np.array(sid_l, dtype=np.int64)
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
            # the view's key per event (each entity's made once, in the order they come)
            ids = eids if len(rows) == len(eids) else [eids[r] for r in rows.tolist()]
            names = {eid: self._key(head + eid + tail, ttl, wall) for eid in dict.fromkeys(ids)}
            keys = np.array([names[eid] for eid in ids], dtype=np.int64)
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
                           sid=sid[at], x=x, reg=reg, rank=rank)

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
        states = self.states
        for i, (k, arrival, sid) in enumerate(zip(keys.tolist(), arrivals.tolist(),
                                                  sids.tolist(), strict=True)):
            if states[k].admit_id(sid, arrival, window):
                fresh[i] = True
                newest[k] = max(newest.get(k, arrival), arrival)
        for k, top in newest.items():
            states[k].forget_ids(top - window)
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


def fold(states: list[KeyState], c: dict[str, np.ndarray]) -> None:
    """Apply ops (columns ``_COLUMNS``, ``key`` numbering ``states``) to the rings."""
    # each slot's ops together, in event order: they are held in it (a slot's ops are one
    # view's and one tile group's, added batch after batch in event order), and sorts are stable
    order = _by_slot(c["key"], c["gid"], c["slot"])
    ks, gs, ss, tiles = (c[name][order] for name in ("key", "gid", "slot", "tile"))
    m = len(order)
    head = np.ones(m, dtype=bool)
    head[1:] = (ks[1:] != ks[:-1]) | (gs[1:] != gs[:-1]) | (ss[1:] != ss[:-1])
    starts = np.flatnonzero(head)  # a group: the ops of one ring slot
    top = np.maximum.reduceat(tiles, starts)  # the newest tile each slot's ops name
    sizes = np.diff(np.append(starts, m))
    live = tiles == np.repeat(top, sizes)  # the ops of that tile
    gk, gg, gslot = ks[starts], gs[starts], ss[starts]
    # the rings (key, tile group) the groups fall in, in turn; slots ascend within a ring
    first = np.ones(len(starts), dtype=bool)
    first[1:] = (gk[1:] != gk[:-1]) | (gg[1:] != gg[:-1])
    ring_at = np.flatnonzero(first)
    ring_end = np.append(ring_at[1:], len(starts))
    slots, tops = gslot.tolist(), top.tolist()
    held: dict[int, Any] = {}  # group -> the record its slot holds for its tile
    skipped: list[int] = []  # groups whose slot holds a newer tile: their ops are skipped
    rings: list[list[Any]] = []
    for a, b, k, gid, last_slot in zip(ring_at.tolist(), ring_end.tolist(), gk[ring_at].tolist(),
                                      gg[ring_at].tolist(), gslot[ring_end - 1].tolist(),
                                      strict=True):
        by_gid = states[k].rings
        ring = by_gid.get(gid)
        if ring is None:
            ring = by_gid[gid] = []
        had = len(ring)
        if last_slot >= had:
            ring.extend([None] * (last_slot + 1 - had))
        rings.append(ring)
        for g in range(a, b) if had else ():
            entry = ring[slots[g]]
            if entry is not None:
                if entry[0] > tops[g]:
                    skipped.append(g)
                elif entry[0] == tops[g]:
                    held[g] = entry[1]
    ring_of = np.repeat(np.arange(len(ring_at)), ring_end - ring_at).tolist()
    todo = np.ones(len(starts), dtype=bool)
    todo[skipped] = False
    distinct = c["reg"][order[starts]] >= 0
    for g in np.flatnonzero(todo & distinct).tolist():
        regs = held.get(g)
        if regs is None:
            regs = bytearray(256)
            rings[ring_of[g]][slots[g]] = [tops[g], regs]
        ops = order[starts[g]:starts[g] + sizes[g]][live[starts[g]:starts[g] + sizes[g]]]
        for reg, rank in zip(c["reg"][ops].tolist(), c["rank"][ops].tolist(), strict=True):
            if rank > regs[reg]:
                regs[reg] = rank
    numeric = np.flatnonzero(todo & ~distinct)
    if not len(numeric):
        return
    records = _fold_numeric(c, order, live, starts, sizes, numeric, held)
    if not held:  # slots that held nothing for these tiles (a fresh store: all)
        for g, row in zip(numeric.tolist(), records, strict=True):
            rings[ring_of[g]][slots[g]] = [tops[g], row]
        return
    for g, row in zip(numeric.tolist(), records, strict=True):
        record = held.get(g)
        if record is None:
            rings[ring_of[g]][slots[g]] = [tops[g], row]
        else:
            record[:] = row


def _by_slot(keys: np.ndarray, gids: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The stable order by (key, tile group, slot): one sort of a combined number where it
    fits in 62 bits (always, but for rings of millions of tiles), else three."""
    n_gid, n_slot = int(gids.max()) + 1, int(slots.max()) + 1
    if (int(keys.max()) + 1) * n_gid * n_slot < 2 ** 62:
        return np.argsort((keys * n_gid + gids) * n_slot + slots, kind="stable")
    return np.lexsort((slots, gids, keys))


def _fold_numeric(c: dict[str, np.ndarray], order: np.ndarray, live: np.ndarray,
                  starts: np.ndarray, sizes: np.ndarray, groups: np.ndarray,
                  held: dict[int, Any]) -> list[list[Any]]:
    """``NumericTile.update`` of each group's live ops, one event at a time across the groups,
    from the record the group's slot holds (``held``) or a new one: the records after."""
    picked = np.flatnonzero(live)
    owner = np.repeat(np.arange(len(starts)), sizes)[picked]
    runs = np.searchsorted(owner, groups, side="left")  # each group's live ops, one run each
    counts = np.searchsorted(owner, groups, side="right") - runs
    ops = order[picked]
    # times and ids below 2**53 (``to_ms``'s range, 53-bit ids): exact as doubles
    ts, ar, sid = (c[name][ops].astype(np.float64) for name in ("ts", "arrival", "sid"))
    xs = c["x"][ops]
    rec = np.empty((len(groups), len(EMPTY_RECORD)), dtype=np.float64)
    rec[:] = EMPTY_RECORD
    kept = [i for i, g in enumerate(groups.tolist()) if g in held]
    if kept:
        rec[kept] = [held[g] for g in groups[kept].tolist()]
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
    rows = np.stack([n, s, cc, mu, m2, mn, mx]).T.tolist()
    won = np.maximum(winner, 0)
    # the winning event's own values, as Python ints and floats (as the reference keeps them)
    last = zip(c["ts"][won].tolist(), c["arrival"][won].tolist(), c["sid"][won].tolist(),
               c["x"][won].tolist(), strict=True)
    if kept:  # ``last`` stays the held record's where no op of the group won
        for i in np.flatnonzero(winner < 0).tolist():
            rows[i] += held[int(groups[i])][7:]
    for row, w, tail in zip(rows, winner.tolist(), last, strict=True):
        if w >= 0:
            row.extend(tail)
    return rows
