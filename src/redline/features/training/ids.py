"""Entity and event ids as integer codes: an input's id columns (:class:`Ids`), the label rows'
ids (:class:`LabelIds`), and the integer tools both lean on (dense factorisation, lookup
tables, radix-friendly stable sorts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from redline.features.tiles import TileWindow
from redline.features.training.columns import ALL_VALID, Column, per_value


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
            self.ok = ALL_VALID
            return
        obj = col.obj
        if not col.is_text():
            obj = per_value(col, fn)  # every value through the decoder's rule, then as texts
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


def read_bounds(times: np.ndarray, window: TileWindow, skew_ms: int
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
        (:func:`read_bounds`). Kept for the next view of the same rows."""
        qtimes = self.by_id(times)[2]
        k = (window.tile_ms, window.tiles, skew_ms)
        with self._lock:
            if k not in self._bounds:
                self._bounds[k] = read_bounds(qtimes, window, skew_ms)
            return self._bounds[k]

    def row_bounds(self, times: np.ndarray, window: TileWindow, skew_ms: int
                   ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`bounds` in row order. Kept for the next view of the same rows."""
        k = (window.tile_ms, window.tiles, skew_ms)
        with self._lock:
            if self._row_times is not times:
                self._row_times, self._row_bounds = times, {}
            if k not in self._row_bounds:
                self._row_bounds[k] = read_bounds(times, window, skew_ms)
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
