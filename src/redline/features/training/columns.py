"""Events as columns, as the decoder would receive them, each value coerced by the decoder's own
per-value functions (``event_values.coerce``, ``to_ms``, ``entity_id_of``); a typed column takes a
vectorised branch only where the per-value result is the same for every value of its dtype.

Inputs the column path does not take (events of several sources, nested ``{"d": ...}`` entries,
Redis Stream maps) give ``None`` here, and the builder replays them through the store instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pandas as pd

from redline.features.event_values import MAX_TS_MS, MIN_TS_MS, coerce, to_ms
from redline.features.eventfile import EventLog
from redline.features.frames import frame_value


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


def per_value(col: Column, fn: Callable[[Any], Any]) -> list[Any]:
    obj = col.obj if col.obj is not None else [frame_value(v) for v in col.arr]  # type: ignore[union-attr]
    return [None if v is None else fn(v) for v in obj]


def _mask(vals: list[Any]) -> np.ndarray:
    return np.fromiter((v is not None for v in vals), dtype=bool, count=len(vals))


def times_ms(col: Column) -> tuple[np.ndarray, np.ndarray]:
    """(valid, epoch ms) of a time column, by ``event_values.to_ms``'s rules."""
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
    vals = per_value(col, to_ms)
    ok = _mask(vals)
    return ok, np.array([v if v is not None else 0 for v in vals], dtype=np.int64)


ALL_VALID = np.ones(0, dtype=bool)  # a validity mask meaning "every event": nothing to apply


class Field:
    """A schema field coerced like ``event_values.coerce``: which events have a valid value,
    the value as a double (what numeric aggregates add), and the Python value (what a distinct
    counts). A typed numeric column keeps its own array (``raw``) and casts to doubles only what
    is asked: the values a ``last`` picks, or the whole column when something adds them."""

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
                self.ok = ALL_VALID if every else np.isfinite(a)
                return
            if typ == "float" and kind in "iuf":
                x = a.astype(np.float64)
                self.ok, self._x = np.isfinite(x), x
                return
            if typ == "int" and kind in "iu":
                self.ok, self.raw = ALL_VALID, a  # the ints a distinct counts and a tie hashes
                return
            if typ == "int" and kind == "f":
                with np.errstate(invalid="ignore"):
                    self.ok = np.isfinite(a) & (np.floor(a) == a)
                self._x = np.where(self.ok, a, 0.0)
                return
            if typ == "bool" and kind == "b":
                self.ok, self.raw = ALL_VALID, a
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
            py = per_value(col, lambda v: coerce(v, typ, flat))
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
