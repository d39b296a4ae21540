"""The offline builder's fast path: the online replay computed by columns instead of event by event.

A memory store fed the events in arrival order and read at ``t`` answers, for an entity and a
window, the aggregate of the events that (a) the decoder admits, (b) are not a redelivery its
event-id window drops, (c) had arrived by ``t`` and (d) fall in the tiles covering ``t``. This
module computes exactly that set with numpy — columns coerced by the decoder's own per-value
functions (``events._coerce``, ``to_ms``, ``entity_id_of``; a typed column takes a vectorised
branch only where the per-value result is the same for every value of the dtype), the events of
a view sorted by (entity, event time, arrival), one ``searchsorted`` per label row for the
window's tile range, the arrival condition as a filter — and aggregates each row's events with
the same rules as ``aggregates.NumericTile``: count exact, sum compensated (Neumaier, ``±inf``
once it overflows, then the running mean for the mean), min/max exact, ``last`` by (event time,
arrival, stable id, first applied), HyperLogLog registers merged by max and estimated with the
same arithmetic in the same order. Sums, means and standard deviations may differ from the
store's in the last bits (they add the same numbers in another order); every other output is
bit-identical. ``tests/features/test_asof.py`` holds it to the event-by-event replay.

Why the skipped tiles, ring slots and key expiry of the stores change nothing here: an update is
skipped or overwritten only when no read at or after its arrival covers its tile (``tiles.place``,
``tiles.ring_size``), and a key expires only after its TTL of silence, by which time a redelivery
of one of its events is dead-lettered as late anyway.

Inputs it does not take (events of several sources, nested ``{"d": ...}`` entries, Redis Stream
maps) return ``None``, and the builder replays them through the store instead.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pandas as pd

from redline.features.definitions import FeatureView
from redline.features.events import (
    MAX_TS_MS,
    MIN_TS_MS,
    EventDecoder,
    _coerce,
    entity_id_of,
    event_id_of,
    stable_id,
    to_ms,
)
from redline.features.tiles import TileWindow, admitted_array

ARRIVAL = "_arrival_ms"
CHUNK = 2_000_000  # gathered (row, event) pairs per step: bounds memory on dense windows
_POW2 = np.array([2.0 ** -r for r in range(256)])  # exactly hll_estimate's terms


class Column:
    """One field of every event: a numpy array of a plain dtype (``arr``; NaN/NaT are absent
    cells) or Python values (``obj``; ``None`` is absent), as the decoder would receive them."""

    __slots__ = ("arr", "obj", "n", "text", "absent")

    def __init__(self, n: int, arr: np.ndarray | None = None, obj: list[Any] | None = None,
                 text: bool = False, absent: bool = False):
        self.n, self.arr, self.obj = n, arr, obj
        self.text = text  # obj holds only str and None
        self.absent = absent  # the frame has no such column: every cell is missing

    def is_text(self) -> bool:
        return self.text or (self.obj is not None
                             and all(type(v) is str or v is None for v in self.obj))


def frame_value(v: Any) -> Any:
    """A DataFrame cell as the decoder gets it: a missing cell (None/NaN/NaT) is ``None``, numpy
    scalars become Python ones."""
    if v is None or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "item") and not isinstance(v, str | bytes):
        return v.item()
    return v


def _series_column(s: pd.Series) -> Column:
    dt = s.dtype
    if isinstance(dt, np.dtype) and dt.kind in "iufb":
        return Column(len(s), arr=s.to_numpy())
    if isinstance(dt, np.dtype | pd.DatetimeTZDtype) and dt.kind == "M":
        return Column(len(s), arr=s.array)  # type: ignore[arg-type]
    obj = s.to_numpy(dtype=object)
    if isinstance(dt, pd.StringDtype):  # text or missing: nothing else to convert
        obj[pd.isna(obj)] = None
        return Column(len(s), obj=obj.tolist(), text=True)
    return Column(len(s), obj=[frame_value(v) for v in obj])


def columns(events: Any, names: Sequence[str], source: str
            ) -> tuple[dict[str, Column], np.ndarray, bool] | None:
    """(column per name, rows that are events, flat) — ``None`` for inputs left to the replay."""
    from redline.features.offline import EventLog

    if isinstance(events, pd.DataFrame):
        n = len(events)
        if "source" in events.columns and not (
                (events["source"] == source).all()
                or _one_source(events["source"].tolist(), source)):
            return None
        # an absent column: every cell missing (NaN reads as a missing cell on every branch)
        cols = {c: (_series_column(events[c]) if c in events.columns
                    else Column(n, arr=np.full(n, np.nan), absent=True)) for c in names}
        return cols, np.ones(n, dtype=bool), False
    log = events if isinstance(events, EventLog) else EventLog(list(events))
    rows: list[Any] = []
    ok = np.ones(len(log.raws), dtype=bool)
    for i, raw in enumerate(log.raws):
        if isinstance(raw, bytes | str):
            try:
                raw = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raw = None
        if not isinstance(raw, dict):
            if isinstance(raw, Mapping):
                return None  # another mapping type: left to the decoder
            ok[i] = False
            rows.append({})
            continue
        if len(raw) == 1 and ("d" in raw or b"d" in raw):
            return None  # a nested entry
        rows.append(raw)
    if any(isinstance(k, bytes) for r in rows[:1000] for k in r):
        return None  # a Redis Stream map
    if not _one_source([r.get("source") for r in rows], source):
        return None
    cols = {c: Column(len(rows), obj=[r.get(c) for r in rows]) for c in names}
    return cols, ok, log.flat


def _one_source(values: list[Any], source: str) -> bool:
    return all(v is None or v == source or (isinstance(v, float) and math.isnan(v))
               for v in values)


def _per_value(col: Column, fn: Callable[[Any], Any]) -> list[Any]:
    obj = col.obj if col.obj is not None else [frame_value(v) for v in col.arr]  # type: ignore[union-attr]
    return [None if v is None else fn(v) for v in obj]


def _mask(vals: list[Any]) -> np.ndarray:
    return np.fromiter((v is not None for v in vals), dtype=bool, count=len(vals))


def times_ms(col: Column) -> tuple[np.ndarray, np.ndarray]:
    """(valid, epoch ms) of a time column, by ``events.to_ms``'s rules."""
    a = col.arr
    if a is not None and not isinstance(a, np.ndarray):  # datetimes (tz-aware or not)
        unit = getattr(a, "unit", "ns")
        i8 = np.asarray(a.asi8, dtype=np.int64)  # type: ignore[attr-defined]
        ok = i8 != np.iinfo(np.int64).min  # NaT
        per = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
        ms = i8 * 1000 if per is None else np.floor_divide(i8, per)
        return ok & (ms >= MIN_TS_MS) & (ms <= MAX_TS_MS), ms
    if a is not None and a.dtype.kind == "i":
        return (a >= MIN_TS_MS) & (a <= MAX_TS_MS), a.astype(np.int64)
    if a is not None and a.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            fl = np.floor(a)
            ok = np.isfinite(a) & (fl >= MIN_TS_MS) & (fl <= MAX_TS_MS)
        return ok, np.where(ok, fl, 0).astype(np.int64)
    if col.obj is not None and all(type(v) is int for v in col.obj):
        if not col.obj or (min(col.obj) >= MIN_TS_MS and max(col.obj) <= MAX_TS_MS):
            return np.ones(col.n, dtype=bool), np.array(col.obj, dtype=np.int64)
    vals = _per_value(col, to_ms)
    ok = _mask(vals)
    return ok, np.array([v if v is not None else 0 for v in vals], dtype=np.int64)


_ALL = np.ones(0, dtype=bool)  # a validity mask meaning "every event": nothing to apply


class Field:
    """A schema field coerced like ``events._coerce``: which events have a valid value, the value
    as a double (what numeric aggregates add), and the Python value (what a distinct counts).
    A typed numeric column keeps its own array (``raw``) and casts to doubles only what is
    asked: the values a ``last`` picks, or the whole column when something adds them."""

    def __init__(self, col: Column, typ: str, flat: bool) -> None:
        self.typ = typ
        a = col.arr
        self.py: list[Any] | None = None
        self.raw: np.ndarray | None = None  # valid events' doubles are raw's, cast
        self._x: np.ndarray | None = None
        if a is not None and isinstance(a, np.ndarray) and not flat:
            kind = a.dtype.kind
            if typ == "float" and kind in "iuf" and a.dtype.itemsize <= 8:
                # float16/32/64 and integers: finite exactly when their double is; a finite
                # sum (no allocation) shows every value finite (a NaN or inf makes it so)
                self.raw = a
                with np.errstate(over="ignore", invalid="ignore"):
                    every = kind != "f" or bool(np.isfinite(a.sum()))
                self.ok = _ALL if every else np.isfinite(a)
                return
            if typ == "float" and kind in "iuf":
                x = a.astype(np.float64)
                self.ok, self._x = np.isfinite(x), x
                return
            if typ == "int" and kind in "iu":
                self.ok, self.raw = _ALL, a  # the ints a distinct counts and a tie hashes
                return
            if typ == "int" and kind == "f":
                with np.errstate(invalid="ignore"):
                    self.ok = np.isfinite(a) & (np.floor(a) == a)
                self._x = np.where(self.ok, a, 0.0)
                return
            if typ == "bool" and kind == "b":
                self.ok, self.raw = _ALL, a
                return
            if kind in "iufb":  # a number where a string is due, a bool where a number is...
                self.ok, self._x = np.zeros(len(a), dtype=bool), np.zeros(len(a))
                return
        if (a is None and typ == "float" and not flat and col.obj
                and all(type(v) is float for v in col.obj)):
            x = np.array(col.obj, dtype=np.float64)
            self.ok, self._x = np.isfinite(x), x
            return
        py: list[Any]
        if typ == "str" and col.obj is not None and col.is_text():
            py = col.obj  # text is a valid str value as it is (JSON, CSV or a frame)
        else:
            py = _per_value(col, lambda v: _coerce(v, typ, flat))
        self.py = py
        self.ok = _mask(py)
        if typ in ("int", "float", "bool"):
            self._x = np.array([float(v) if v is not None else 0.0 for v in py])
        else:
            self._x = np.zeros(col.n)

    @property
    def x(self) -> np.ndarray:
        """Every event's value as a double (0 or the raw value where not valid)."""
        if self._x is None:
            assert self.raw is not None
            self._x = self.raw.astype(np.float64)
        return self._x

    @property
    def held(self) -> np.ndarray:
        """The values as held: the typed column (``raw``) where there is one, else doubles."""
        return self.raw if self.raw is not None else self.x

    def take(self, pos: np.ndarray) -> np.ndarray:
        """The doubles of the events at ``pos`` (file positions), cast after the gather."""
        return self.held.take(pos).astype(np.float64, copy=False)

    def value(self, i: int) -> Any:
        """The Python value of event ``i`` (valid events only), of the field's type."""
        if self.py is not None:
            return self.py[i]
        v = float(self.x[i])
        if self.typ == "int":
            return int(self.raw[i]) if self.raw is not None else int(v)
        if self.typ == "bool":
            return bool(v)
        return v


class _DistinctTexts:
    """Distinct ids held as integers (``ints``) are formatted as texts only when asked."""

    ints: np.ndarray | None
    _texts: list[str] | None

    @property
    def texts(self) -> list[str]:
        if self._texts is None:
            assert self.ints is not None
            self._texts = [str(int(u)) for u in self.ints.tolist()]
        return self._texts


class Ids(_DistinctTexts):
    """An id column (entity or event id) as codes into its distinct texts; ``ok``: valid ids.
    An integer column keeps its numbers (``raw``), numbers its distinct values (``ints``) only
    when asked (a view looks its label ids up straight from ``raw``), and formats them as texts
    only when asked."""

    def __init__(self, col: Column, fn: Callable[[Any], str | None]) -> None:
        a = col.arr
        self._ints: np.ndarray | None = None
        self._codes: np.ndarray | None = None
        self._texts: list[str] | None = None
        self.raw: np.ndarray | None = None
        if a is not None and isinstance(a, np.ndarray) and a.dtype.kind in "fb":
            # a float or a bool is no id
            self.ok, self._codes, self._texts = (np.zeros(col.n, dtype=bool),
                                                 np.full(col.n, -1, dtype=np.int64), [])
            return
        if a is not None and isinstance(a, np.ndarray) and a.dtype.kind in "iu":
            # every integer is the id of its decimal text, and distinct integers have distinct
            # texts: factorise the numbers (when asked), format only the distinct ones
            self.raw = a
            self.ok = _ALL
            return
        obj = col.obj
        if not col.is_text():
            obj = _per_value(col, fn)  # every value through the decoder's rule, then as texts
        codes, uniq = pd.factorize(np.array(obj, dtype=object))  # None: -1
        self._texts = [str(u) for u in uniq]
        good = np.array([t != "" for t in self._texts] + [False], dtype=bool)
        self._codes = codes.astype(np.int64)
        self.ok = good[self._codes]  # code -1 picks the trailing False

    def _factorize(self) -> None:
        if self._codes is None:
            assert self.raw is not None
            codes, uniq = factorize_ints(self.raw)
            self._codes, self._ints = codes, np.asarray(uniq)

    @property
    def codes(self) -> np.ndarray:
        """Per row, the index of its id among the distinct ids (-1: none)."""
        self._factorize()
        assert self._codes is not None
        return self._codes

    @property
    def ints(self) -> np.ndarray | None:  # type: ignore[override]
        """The distinct ids as integers (``None``: the column is not integers)."""
        if self.raw is not None:
            self._factorize()
        return self._ints

    def __len__(self) -> int:
        return len(self.ints) if self.ints is not None else len(self.texts)


DENSE_SLACK = 65_536  # a table of ids this much wider than twice their count is still cheap


def _dense_range(a: np.ndarray, count: int) -> int | None:
    """The smallest of integers ``a`` when they span few enough values for a table indexed by
    value (at most twice ``count``, plus some), else ``None``."""
    if not len(a) or a.dtype.kind not in "iu":
        return None
    lo, hi = int(a.min()), int(a.max())
    if hi - lo >= 2 * count + DENSE_SLACK or lo <= -2**63 + 1 or hi >= 2**63 - 1:
        return None
    return lo


def factorize_ints(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize`` of integers, the codes numbering the distinct values in ascending order.
    Ids in a dense range (card numbers, row numbers) take a table indexed by value instead of a
    hash: a few passes over memory instead of a probe per value."""
    lo = _dense_range(a, len(a))
    if lo is None:
        codes, uniq = pd.factorize(a)
        return np.asarray(codes, dtype=np.int64), np.asarray(uniq)
    off = a.astype(np.int64, copy=False) - lo
    present = np.zeros(int(off.max()) + 1, dtype=bool)
    present[off] = True
    code_of = np.cumsum(present) - 1
    return code_of[off], np.flatnonzero(present) + lo


def id_table(keys: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A lookup of the distinct integers ``keys``: per query, the position of the equal key,
    -1 where none is (``pd.Index(keys).get_indexer``). Keys in a dense range take a table
    indexed by value (up to about twice as wide as there are keys)."""
    lo = _dense_range(keys, 2 * len(keys))
    if lo is None or keys.dtype != np.int64:
        index = pd.Index(keys)
        return lambda q: np.asarray(index.get_indexer(q), dtype=np.int64)
    hi = int(keys.max())
    table = np.full(hi - lo + 3, -1, dtype=np.int64)  # a -1 on each side for queries outside
    table[keys - (lo - 1)] = np.arange(len(keys))

    def find(q: np.ndarray) -> np.ndarray:
        if q.dtype != np.int64:
            return np.asarray(pd.Index(keys).get_indexer(q), dtype=np.int64)
        return table.take(np.clip(q, lo - 1, hi + 1) - (lo - 1))
    return find


def as_int64(a: np.ndarray | None) -> np.ndarray | None:
    """Integers as int64, or ``None`` where some do not fit."""
    if a is None or (a.dtype.kind == "u" and len(a) and int(a.max()) >= 2**63):
        return None
    return a.astype(np.int64, copy=False)


def _read_bounds(times: np.ndarray, window: TileWindow, skew_ms: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per read time, the event times it merges, ``[first, end)``: from the window's first tile
    on, and below both the end of its last tile and the latest event time that can have arrived
    by then (the decoder admits no event whose time is ahead of its arrival by more than the
    skew)."""
    lo, hi = window.covering_array(times)
    return lo * window.tile_ms, np.minimum((hi + 1) * window.tile_ms, times + (skew_ms + 1))


class LabelIds(_DistinctTexts, Sequence[str]):
    """The label rows' entity ids as a sequence of texts, held as codes into the distinct ids
    (``ints``: the distinct ids as integers, when the column holds integers)."""

    def __init__(self, codes: np.ndarray, texts: list[str] | None,
                 ints: np.ndarray | None = None) -> None:
        self.codes = np.asarray(codes, dtype=np.int64)
        self._texts, self.ints = texts, ints
        self._by_id: tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._bounds: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()  # the views of several sources may run in threads
        self._lookup: Callable[[np.ndarray], np.ndarray] | None = None
        self._row_times: np.ndarray | None = None
        self._row_bounds: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}

    def by_id(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the label rows grouped by id, their id codes, their times), kept for the next view
        of the same rows: rows of one id meet the events of one entity together."""
        with self._lock:
            if self._by_id is not None and self._by_id[0] is times:
                return self._by_id[1]
            order = stable_argsort(self.codes)
            got = (order, self.codes[order], times[order])
            self._by_id = (times, got)
            self._bounds = {}
            return got

    def bounds(self, times: np.ndarray, window: TileWindow, skew_ms: int
               ) -> tuple[np.ndarray, np.ndarray]:
        """Per label row in :meth:`by_id` order, the event times a read at its time merges
        (:func:`_read_bounds`). Kept for the next view of the same rows."""
        qtimes = self.by_id(times)[2]
        k = (window.tile_ms, window.tiles, skew_ms)
        with self._lock:
            if k not in self._bounds:
                self._bounds[k] = _read_bounds(qtimes, window, skew_ms)
            return self._bounds[k]

    def row_bounds(self, times: np.ndarray, window: TileWindow, skew_ms: int
                   ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`bounds` in row order. Kept for the next view of the same rows."""
        k = (window.tile_ms, window.tiles, skew_ms)
        with self._lock:
            if self._row_times is not times:
                self._row_times, self._row_bounds = times, {}
            if k not in self._row_bounds:
                self._row_bounds[k] = _read_bounds(times, window, skew_ms)
            return self._row_bounds[k]

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Per integer id (int64), the code of the equal label id, -1 where none is; the table
        (or hash) of the label ids is made once for every source."""
        assert self.ints is not None
        with self._lock:
            if self._lookup is None:
                self._lookup = id_table(self.ints)
        return self._lookup(ids)

    @staticmethod
    def of_texts(ids: Sequence[str]) -> LabelIds:
        codes, uniq = pd.factorize(np.array(list(ids), dtype=object), use_na_sentinel=False)
        return LabelIds(codes, [str(u) for u in uniq])

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.texts[c] for c in self.codes[i].tolist()]
        return self.texts[int(self.codes[i])]


class Decoded:
    """The admitted events of one source, as columns (file order)."""

    def __init__(self, decoder: EventDecoder, events: Any) -> None:
        plan = next(iter(decoder.plans.values()))
        self.plan = plan
        src = plan.source
        names = [src.timestamp, plan.join_key, *[f for f, _ in plan.fields], ARRIVAL]
        if plan.event_id:
            names.append(plan.event_id)
        got = columns(events, names, src.name)
        self.ready = got is not None
        self.orders: dict[Any, Any] = {}  # the last views' sorted events (see _keyed)
        if got is None:
            return
        cols, ok, flat = got
        self.rows = len(ok)  # input rows, admitted or not
        ts_ok, ts = times_ms(cols[src.timestamp])
        arrival = ts if ts_ok.all() else np.where(ts_ok, ts, 0)  # else: the event time
        if not cols[ARRIVAL].absent:
            ar_ok, ar = times_ms(cols[ARRIVAL])
            arrival = np.where(ar_ok, ar, arrival)
        ok &= ts_ok
        ent = Ids(cols[plan.join_key], entity_id_of)
        if ent.ok is not _ALL:
            ok &= ent.ok
        self.fields = {f: Field(cols[f], t, flat) for f, t in plan.fields}
        for fld in self.fields.values():
            if fld.ok is not _ALL:
                ok &= fld.ok
        if plan.event_id:
            ev = Ids(cols[plan.event_id], event_id_of)
            if ev.ok is not _ALL:
                ok &= ev.ok
        if arrival is not ts or plan.lateness_ms < 0 or plan.skew_ms < 0:  # else all on time
            ok &= admitted_array(ts, arrival, plan.lateness_ms, plan.skew_ms)
        self.every = bool(ok.all())  # every event admitted (the usual case): no copies
        if self.every:
            self.index = np.arange(len(ok))
            self.ts, self.arrival = ts, arrival
        else:
            self.index = np.flatnonzero(ok)  # file positions of the admitted events
            self.ts, self.arrival = ts[self.index], arrival[self.index]
        self.entities = ent
        self._entity: np.ndarray | None = None
        self._entity_ids: dict[str, int] | None = None
        if plan.event_id:
            self.ident_codes = ev.codes[self.index]
            self.ident_texts = ev.texts

    @property
    def entity(self) -> np.ndarray:
        """Per admitted event, its entity's code (numbered when first asked)."""
        if self._entity is None:
            codes = self.entities.codes
            self._entity = codes if self.every else codes[self.index]
        return self._entity

    @property
    def entity_texts(self) -> list[str]:
        return self.entities.texts

    def event_ranks(self, lab: LabelIds) -> tuple[np.ndarray, np.ndarray]:
        """(per distinct label id, per admitted event) the rank of :meth:`ranks`. Integer ids
        meet integer label ids straight, without numbering the events' entities first:
        distinct ids name distinct entities, so an entity's rank is the code of its label id."""
        raw = as_int64(self.entities.raw)
        if lab.ints is None or raw is None:
            label_rank, entity_rank = self.ranks(lab)
            return label_rank, entity_rank[self.entity]
        rank = lab.lookup(raw if self.every else raw[self.index])
        seen = np.zeros(len(lab.ints) + 1, dtype=bool)
        seen[rank + 1] = True  # slot 0: events no label id names
        label_rank = (np.arange(1, len(seen)) * seen[1:]) - 1  # -1: an id without events
        return label_rank, rank

    def ranks(self, lab: LabelIds) -> tuple[np.ndarray, np.ndarray]:
        """(per distinct label id, per entity code) a rank: the first distinct label id naming
        the entity, so that label rows in the order of their ids' codes meet the entities in
        rank order. -1: an id whose entity has no events, an entity no label id names."""
        ent = self.entities  # integer pairs never come here: event_ranks meets them itself
        if self._entity_ids is None:
            self._entity_ids = {t: c for c, t in enumerate(ent.texts)}
        get = self._entity_ids.get
        lut = np.array([get(t, -1) for t in lab.texts], dtype=np.int64)
        named = np.flatnonzero(lut >= 0)
        entity_rank = np.full(len(ent), len(lut), dtype=np.int64)
        np.minimum.at(entity_rank, lut[named], named)
        entity_rank[entity_rank == len(lut)] = -1
        label_rank = np.full(len(lut), -1, dtype=np.int64)
        label_rank[named] = entity_rank[lut[named]]
        return label_rank, entity_rank

    def stable_id(self, k: int) -> int:
        """``events`` stable id of admitted event ``k`` (the decoder's, for ties of ``last``)."""
        plan = self.plan
        if plan.event_id:
            ident = self.ident_texts[int(self.ident_codes[k])]
            return stable_id([plan.name_bytes, b"id", ident.encode()])
        i = int(self.index[k])
        values = {f: self.fields[f].value(i) for f, _ in plan.fields}
        return plan.stable_id(int(self.ts[k]), self.entity_texts[int(self.entity[k])], values)


def _fresh(dec: Decoded, view: FeatureView) -> np.ndarray:
    """Which admitted events a view's key applies: the first of each event id, and again only
    when it arrives more than the dedup window after the last applied one (the stores' rule).
    Only events that update some tile of the view are remembered (as a store records ids)."""
    n = len(dec.ts)
    fresh = np.ones(n, dtype=bool)
    dedup = dec.plan.dedup_ms
    if not dec.plan.event_id or dedup <= 0 or n == 0:
        return fresh
    placed = np.zeros(n, dtype=bool)
    for g in view.layout().groups:
        placed |= dec.ts // g.tile_ms >= dec.arrival // g.tile_ms - g.tiles + 1
    cand = np.flatnonzero(placed)
    order = cand[np.lexsort((cand, dec.arrival[cand], dec.ident_codes[cand], dec.entity[cand]))]
    key_e, key_i = dec.entity[order], dec.ident_codes[order]
    same = (key_e[1:] == key_e[:-1]) & (key_i[1:] == key_i[:-1])
    starts = np.flatnonzero(np.r_[True, ~same])
    ends = np.r_[starts[1:], len(order)]
    for s, e in zip(starts[ends - starts > 1].tolist(), ends[ends - starts > 1].tolist(),
                    strict=True):
        last = None
        for k in order[s:e].tolist():
            a = int(dec.arrival[k])
            if last is None or a - last > dedup:
                last = a
            else:
                fresh[k] = False
    return fresh


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


def view_values(dec: Decoded, view: FeatureView, times: np.ndarray, ids: Sequence[str]
                ) -> np.ndarray:
    """(rows, outputs) float64: what a memory store fed the events answers per label row."""
    lay = view.layout()
    nrows = len(times)
    out = np.empty((nrows, len(lay.outputs)), order="F")  # a feature's column is contiguous
    lab = ids if isinstance(ids, LabelIds) else LabelIds.of_texts(ids)
    kinds = {o.kind for o in lay.outputs}
    fresh = _fresh(dec, view)
    # windows of one tile size and length read the same events: find them once
    same: dict[tuple[int, int], list[Any]] = {}
    for w in lay.windows:
        same.setdefault((w.window.tile_ms, w.window.tiles), []).append(w)
    plans = []
    for ws in same.values():
        groups = [(lay.groups[w.gid], [(i, o) for i, o in enumerate(lay.outputs)
                                        if o.wid == w.wid]) for w in ws]
        plans.append((ws[0].window, groups,
                      all(o.kind == "last" for _, outs in groups for _, o in outs)))
    snap = _snapshot(dec, lab, fresh) if any(p[2] for p in plans) else None
    if snap is not None:
        snap_rows = _SnapshotRows(dec, snap, lab, times)
        for window, groups, _ in (p for p in plans if p[2]):
            _pick_last(dec, groups, out, snap_rows.at(window))
        plans = [p for p in plans if not p[2]]
    if not plans:
        return out
    ev = _keyed(dec, lab, fresh, "last" in kinds)
    sel, ar, key, span, rank = ev.sel, ev.ar, ev.key, ev.span, ev.rank
    # label rows grouped by id: the binary searches then walk the keys in order; every array
    # below is in that order until the values are put back in place
    rows_by_key, qcodes, qtimes = lab.by_id(times)
    qrank = ev.label_rank[qcodes]
    qbase = qrank * span
    have = qrank >= 0
    hll_pos: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for window, groups, all_last in plans:
        first, end = lab.bounds(times, window, dec.plan.skew_ms)
        right = ev.search(qrank, qbase + rank(end))
        if all_last:
            found = _last_arrived(key, ar, qtimes, qbase + rank(first), right, have, len(sel))
            _put_last(dec, ev, groups, out, rows_by_key, found)
            continue
        plan = []
        for g, outs in groups:
            x = ev.values(dec, g.field) if g.field and not g.hll else None
            if g.hll:
                assert g.field is not None
                if g.field not in hll_pos:
                    hll_pos[g.field] = _hll_positions(dec, g.field, sel)
            plan.append((outs, x, hll_pos.get(g.field or "") if g.hll else None))
        left = ev.search(qrank, qbase + rank(first))
        lengths = np.where(have, np.maximum(right - left, 0), 0)
        for rows, seg, pos in _gathered(left, lengths, ar, qtimes):
            place = rows_by_key[rows]
            for outs, x, hll in plan:
                cols = np.array([i for i, _ in outs])
                out[np.ix_(place, cols)] = _aggregate([o for _, o in outs], len(place), seg,
                                                      pos, x, hll)
    return out


def _put_last(dec: Decoded, ev: _Keyed, groups: list[tuple[Any, list[tuple[int, Any]]]],
              out: np.ndarray, rows_by_key: np.ndarray, found: np.ndarray) -> None:
    """``last`` outputs from the position of each row's last arrived event (``found``, in
    :meth:`LabelIds.by_id` order; ``len(ev.sel)``: none): one gather per output from the input's
    own column with the default appended, which a row without an event picks. No mask and no
    negative index: numpy's selections by an unpredictable mask, and its gathers that wrap
    negative positions, cost several times a plain gather."""
    n = dec.rows  # the default's slot: past every input row
    at = np.full(len(out), n, dtype=np.int64)
    if len(found):
        at[rows_by_key] = np.append(ev.files(dec), n).take(found, mode="clip")
    _pick_last(dec, groups, out, at)


class _SnapshotRows:
    """Per label row (in row order) of a snapshot table (see :func:`_snapshot`), its entity's
    event: which input row holds it, its time, and whether it had arrived by the row's time."""

    def __init__(self, dec: Decoded, snap: np.ndarray, lab: LabelIds, times: np.ndarray) -> None:
        self.dec, self.lab, self.times = dec, lab, times
        self.none = np.full(len(times), dec.rows, dtype=np.int64)  # the defaults' slot
        self.any = bool(len(dec.index))
        if self.any:
            event = snap.take(lab.codes)  # -1: none
            pick = np.maximum(event, 0)
            self.ts, self.files = dec.ts.take(pick), dec.index.take(pick)
            self.has = (event >= 0) & (dec.arrival.take(pick) <= times)

    def at(self, window: TileWindow) -> np.ndarray:
        """Per row, the input row of its ``last`` in ``window`` (``dec.rows``: none): the event
        if its time is in the range a read merges (:func:`_read_bounds`)."""
        if not self.any:
            return self.none
        first, end = self.lab.row_bounds(self.times, window, self.dec.plan.skew_ms)
        valid = self.has & (self.ts >= first) & (self.ts < end)
        n = self.dec.rows
        return (self.files - n) * valid + n  # np.where by arithmetic: no branch per row


def _pick_last(dec: Decoded, groups: list[tuple[Any, list[tuple[int, Any]]]], out: np.ndarray,
               at: np.ndarray) -> None:
    """Each ``last`` output's column: the value of the input row ``at`` each row names, or the
    output's default where it names ``dec.rows`` (one past the end)."""
    n = dec.rows
    for g, outs in groups:
        src = dec.fields[g.field].held
        # narrower floats (float32, as Parquet gives them) are picked from as they are, then
        # cast: half the memory to pick from, the same doubles; else doubles, cast as the
        # stores cast them
        wide = (src.dtype == np.float64 or src.dtype.kind != "f"
                or not all(_holds(src.dtype, o.default) for _, o in outs))
        ext = np.empty(n + 1, dtype=np.float64 if wide else src.dtype)
        ext[:-1] = src
        for i, o in outs:
            ext[-1] = o.default
            if wide:
                np.take(ext, at, out=out[:, i], mode="clip")  # in range: clip is unchecked
            else:
                out[:, i] = ext.take(at, mode="clip")


def _holds(dtype: np.dtype, value: float) -> bool:
    """Whether the double ``value`` comes back unchanged from ``dtype`` (NaN as NaN)."""
    back = float(np.asarray(value, dtype=np.float64).astype(dtype))
    return back == value or (math.isnan(back) and math.isnan(value))


SMALL_GROUPS = 3  # at most this many events per entity: bisect inside entities (2 steps)
LAST_STEPS = 8  # steps back over events not yet arrived before the rows left go the long way


def _last_arrived(key: np.ndarray, ar: np.ndarray, times: np.ndarray, low: np.ndarray,
                  right: np.ndarray, have: np.ndarray, none: int = -1) -> np.ndarray:
    """Per row, the last event (in ``last`` order) of positions ``< right[i]`` whose key is at
    least ``low[i]`` (its entity and window) that had arrived by ``times[i]``; ``none`` where
    none had.
    Steps back from the range's end over the events that arrive later (few: late events, or
    future ones within the skew); rows with more gather their range."""
    last = right - 1
    at = np.maximum(last, 0)
    valid = have & (last >= 0) & (key[at] >= low) if len(key) else np.zeros(len(last), bool)
    todo = np.flatnonzero(valid & (ar[at] > times)) if len(key) else np.zeros(0, np.int64)
    for _ in range(LAST_STEPS):
        if not len(todo):
            break
        p = last[todo] - 1
        gone = (p < 0) | (key[np.maximum(p, 0)] < low[todo])
        last[todo] = p
        valid[todo[gone]] = False
        todo = todo[~gone]
        todo = todo[ar[last[todo]] > times[todo]]
    if len(todo):  # rows with many events yet to arrive: gather their events
        left = np.searchsorted(key, low[todo])
        for rows, seg, pos in _gathered(left, last[todo] - left + 1, ar, times[todo]):
            part = todo[rows]
            n = np.bincount(seg, minlength=len(part))
            ends = np.cumsum(n)
            if len(pos):
                last[part] = pos[np.maximum(ends - 1, 0)]
            valid[part] = n > 0
    return (last - none) * valid + none  # np.where by arithmetic: no branch per row


def _gathered(left: np.ndarray, lengths: np.ndarray, ar: np.ndarray, times: np.ndarray
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


def stable_argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` of integers, faster where they are small: numpy sorts
    16-bit integers by radix, so keys below 2**32 take one or two radix passes (low half, then
    high half: stable, so the low order holds among equal high halves)."""
    n = len(key)
    if n == 0 or int(key.min()) < 0 or int(key.max()) >= 2**32:
        return np.argsort(key, kind="stable")
    order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    if int(key.max()) >= 2**16:
        high = (key[order] >> 16).astype(np.uint16)
        order = order[np.argsort(high, kind="stable")]
    return order


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


class _Keyed:
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

    def reorder(self, order: np.ndarray) -> _Keyed:
        return _Keyed(self.label_rank, self.sel[order], self.ar[order], self.key[order],
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
    :func:`_snapshot` and :func:`_keyed` start, made once. ``keep``: left in ``cache``
    (:func:`_orders`) for the next; :func:`_keyed` takes it, its sorted events hold the rest."""
    got = cache.pop("ranked", None)
    if got is None:
        got = (*dec.event_ranks(lab), np.flatnonzero(fresh))
    if keep:
        cache["ranked"] = got
    return got  # type: ignore[no-any-return]


def _snapshot(dec: Decoded, lab: LabelIds, fresh: np.ndarray) -> np.ndarray | None:
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


def _keyed(dec: Decoded, lab: LabelIds, fresh: np.ndarray, last: bool) -> _Keyed:
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
        base = cache["base"] = _Keyed(label_rank, sel[order], ar[order], key, span, t_lo, uts,
                                      starts, int(counts.max()) if len(counts) else 0)
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


HLL_MEMO_SIZE = 1_000_000
_HLL_MEMO: dict[tuple[str, Any], tuple[int, int]] = {}


def _hll_positions(dec: Decoded, field: str, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _aggregate(outs: list[Any], nrows: int, seg: np.ndarray, pos: np.ndarray,
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
