"""The per-partition kernel: one function from (the events of some entities, the label rows of
the same entities) to their training rows. Every engine — in memory, out of core on disk, on
Spark — runs exactly this function on its partitions, so training equals serving on each by
construction rather than by a second implementation.

Contract of :func:`build_partition`
-----------------------------------
``events`` — a ``pandas.DataFrame`` (or a list of event dicts / an ``EventLog``), one row per
event, as ingest would receive it:

* the timestamp column of each source (``EventSource.timestamp``): epoch milliseconds (int64, or
  any value ``event_values.to_ms`` takes: float, datetime64, ISO text);
* the join key column of each source's entity (``Entity.join_key``): text or int64 (``42`` is
  entity ``"42"``; floats and bools are not ids, so such events are dropped as ingest drops them);
* the schema fields of each source, any dtype: each value is coerced by the decoder's own rules;
* optional ``_arrival_ms`` (int64 epoch ms; absent: arrival = event time);
* optional ``source`` (text): required when the requested views read several sources; rows of
  other sources are ignored. Events of several sources may instead come as a mapping from source
  name to its own frame (one Parquet file per source, say: no ``source`` column needed, nothing
  to split); a source the mapping lacks has no events;
* optional ``_seq`` (int64): the event's position in the whole log. Order matters only between
  events of one entity with equal arrival and the same event id (the first applied wins), so an
  engine that cannot keep the log order of an entity's events (a shuffle) passes ``_seq`` and the
  kernel restores it (stable sort). Without ``_seq`` the row order is taken as log order.

Rows may be in any order otherwise; events of entities without label rows cost time but change
nothing. Every event of each labelled entity must be present (a partition holds whole entities).

``labels`` — a ``pandas.DataFrame``: the join key column of every requested view's entity,
``time_column`` in epoch milliseconds (int64; floats must be whole), and any other columns,
passed through unchanged.

Returns ``labels`` (index reset, same row order, same columns and dtypes) followed by one float64
column per requested feature ref ``view:feature`` and transform, in ``features`` order (default:
every view's features, then every transform). A row whose entity has no events gets each
feature's default (counts 0).

The function is pure: no global state, nothing read or written outside its arguments (a process
remembers the hash positions of the distinct values it has counted: a cache of a pure function).
It imports no engine (``offline``, ``outofcore``, ``spark``); they import it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from redline.errors import InvalidInput
from redline.features.definitions import FeatureDefinitions, FeatureView
from redline.features.eventfile import EventLog
from redline.features.training.ids import LabelIds, as_int64, factorize_ints
from redline.features.training.values import point_in_time

SEQ = "_seq"
# Epoch seconds between 2000 and 2100 are epoch milliseconds in the first weeks of 1970: a time
# column entirely in that range was written in seconds.
SECONDS_RANGE = (946_684_800, 4_102_444_800)


def check_milliseconds(values: np.ndarray, what: str) -> None:
    """Refuse a time column that holds epoch seconds (detected by range), saying the fix."""
    v = np.asarray(values)
    if v.dtype.kind not in "iuf" or len(v) == 0:
        return
    with np.errstate(invalid="ignore"):
        finite = v[np.isfinite(v)] if v.dtype.kind == "f" else v
    if len(finite) == 0:
        return
    lo, hi = float(finite.min()), float(finite.max())
    if SECONDS_RANGE[0] <= lo and hi <= SECONDS_RANGE[1]:
        raise InvalidInput(f"{what} looks like epoch seconds (values {int(lo)}..{int(hi)}); "
                           "times must be epoch milliseconds: multiply the column by 1000")


def feature_plan(defs: FeatureDefinitions, features: Sequence[str] | None
                 ) -> tuple[list[str], dict[str, list[tuple[str, int]]], list[Any]]:
    """(refs in output order, per view name its (ref, output index) pairs, transforms)."""
    refs = list(features) if features is not None else (
        [v.ref(f) for v in defs.views.values() for f in v.feature_names] + list(defs.transforms))
    view_refs: dict[str, list[tuple[str, int]]] = {}
    transforms = []
    for ref in refs:
        if ref in defs.transforms:
            transforms.append(defs.transforms[ref])
            continue
        view, idx = defs.resolve(ref)
        view_refs.setdefault(view.name, []).append((ref, idx))
    for tr in transforms:
        for ref in tr.features:
            view, idx = defs.resolve(ref)
            if (ref, idx) not in view_refs.setdefault(view.name, []):
                view_refs[view.name].append((ref, idx))
    return refs, view_refs, transforms


def label_times(labels: pd.DataFrame, time_column: str) -> np.ndarray:
    """The label rows' times as int64 epoch ms, or a clear error."""
    if time_column not in labels.columns:
        raise InvalidInput(f"labels lack the time column '{time_column}'")
    t = pd.to_numeric(labels[time_column], errors="coerce")
    if t.isna().any():
        raise InvalidInput(f"labels column '{time_column}' must be epoch milliseconds")
    arr = t.to_numpy()
    check_milliseconds(arr, f"labels column '{time_column}'")
    return arr.astype(np.int64)


def label_ids(labels: pd.DataFrame, view: FeatureView) -> LabelIds:
    """The label rows' ids of ``view``'s entity, as texts (``42`` and ``42.0`` are ``"42"``)."""
    key = view.entity.join_key
    if key not in labels.columns:
        raise InvalidInput(f"labels lack column '{key}' (entity '{view.entity.name}' id) "
                           f"needed by view '{view.name}'")
    col = labels[key]
    a = col.to_numpy() if isinstance(col.dtype, np.dtype) else None
    if a is not None and a.dtype.kind in "iu" and (ints := as_int64(a)) is not None:
        codes, uniq = factorize_ints(ints)  # distinct integers have distinct texts
        return LabelIds(codes, None, np.asarray(uniq, dtype=np.int64))
    if a is not None and a.dtype.kind == "f":
        codes, uniq = pd.factorize(a, use_na_sentinel=False)
        return LabelIds(codes, [_label_id(u) for u in uniq.tolist()])
    return LabelIds.of_texts([_label_id(x) for x in col.tolist()])


def _label_id(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))  # an id column read as floats (it had gaps): 42.0 is entity "42"
    return str(x)


def apply_transforms(result: pd.DataFrame, transforms: Sequence[Any],
                     computed: dict[str, np.ndarray]) -> None:
    """Add each transform's column to ``result`` from its request columns and features."""
    for tr in transforms:
        absent = [c for c in tr.request if c not in result.columns]
        if absent:
            raise InvalidInput(f"transform '{tr.name}' needs request field(s) {absent} as label "
                               "columns")
        cols = [pd.to_numeric(result[c], errors="coerce").to_numpy(dtype=np.float64)
                for c in tr.request] + [computed[f] for f in tr.features]
        result[tr.name] = tr.compute(cols)


def _in_log_order(events: Any) -> Any:
    if isinstance(events, Mapping):
        return {name: _in_log_order(frame) for name, frame in events.items()}
    if isinstance(events, pd.DataFrame) and SEQ in events.columns:
        order = np.argsort(events[SEQ].to_numpy(), kind="stable")
        return events.iloc[order].drop(columns=[SEQ]).reset_index(drop=True)
    return events


def _values(defs: FeatureDefinitions, views: list[FeatureView], events: Any, times: np.ndarray,
            ids: Mapping[str, Sequence[str]], method: str, threads: int = 1
            ) -> dict[str, np.ndarray]:
    """Per view, (rows, outputs) float64 values; a frame of several sources is split by its
    ``source`` column so each source takes the column path."""
    sources: dict[str, list[FeatureView]] = {}
    for v in views:
        sources.setdefault(v.source.name, []).append(v)
    if (isinstance(events, EventLog) and events.flat and method != "replay"
            and len(sources) > 1):  # CSV rows of several sources: a log per source, by column
        events = {name: EventLog([r for r in events.raws if r.get("source") == name], flat=True)
                  for name in sources}
    if isinstance(events, Mapping):  # a frame per source
        if method == "replay":
            events = _one_frame(events)
        else:
            def one(name: str) -> dict[str, np.ndarray]:
                part = events.get(name)
                if part is None:
                    part = pd.DataFrame({"_empty": []})
                return point_in_time(defs, sources[name], part, times, ids, method=method)
            return _per_source(one, list(sources), threads)
    if (method == "replay" or not isinstance(events, pd.DataFrame)
            or "source" not in events.columns):
        return point_in_time(defs, views, events, times, ids, method=method)
    codes, names = pd.factorize(events["source"])  # missing: -1
    frame, one_at_a_time = events, threading.Lock()

    def split(name: str) -> dict[str, np.ndarray]:
        k = names.get_loc(name) if name in names else len(names)
        mine = codes == k
        if len(sources) == 1:  # a single source is also every row that names none
            mine |= codes < 0
        with one_at_a_time:  # the shared frame is read by one thread at a time
            part = frame[mine].reset_index(drop=True)
        return point_in_time(defs, sources[name], part, times, ids, method=method)
    return _per_source(split, list(sources), threads)


def _per_source(one: Callable[[str], dict[str, np.ndarray]], names: list[str], threads: int
                ) -> dict[str, np.ndarray]:
    """``one(name)`` of every source, merged; in threads when asked (numpy's sorts, searches
    and gathers let go of the interpreter, so sources build side by side on several cores)."""
    out: dict[str, np.ndarray] = {}
    if threads > 1 and len(names) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(threads, len(names))) as pool:
            for got in pool.map(one, names):
                out.update(got)
        return out
    for name in names:
        out.update(one(name))
    return out


def _one_frame(events: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Frames per source as one frame with a ``source`` column."""
    frames = [f.assign(source=name) for name, f in events.items() if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"source": []})


def build_partition(defs: FeatureDefinitions, events: pd.DataFrame | Any, labels: pd.DataFrame,
                    features: Sequence[str] | None = None, *, time_column: str = "ts",
                    method: str = "auto", threads: int = 1) -> pd.DataFrame:
    """Training rows of ``labels`` from ``events`` (see the module docstring for the contract).

    ``method``: ``"columns"`` (vectorised, ``values.py``), ``"replay"`` (event by event through the
    decoder and a memory store: the reference), ``"auto"`` (columns where the input allows).
    ``threads``: sources built at once (the same answer with any number)."""
    refs, view_refs, transforms = feature_plan(defs, features)
    times = label_times(labels, time_column)
    # a new frame: a copy in pandas 2, copied on write in pandas 3 (another copy is waste)
    result = labels.reset_index(drop=True)
    views = [defs.view(name) for name in view_refs]
    by_key: dict[str, LabelIds] = {}  # views of one entity share its label ids
    ids: dict[str, LabelIds] = {}
    for v in views:
        if v.entity.join_key not in by_key:
            by_key[v.entity.join_key] = label_ids(result, v)
        ids[v.name] = by_key[v.entity.join_key]
    computed: dict[str, np.ndarray] = {}
    blocks: list[pd.DataFrame] = []
    if views:
        values = _values(defs, views, _in_log_order(events), times, ids, method, threads)
        for view in views:
            pairs = view_refs[view.name]
            for ref, idx in pairs:
                computed[ref] = values[view.name][:, idx]
            idxs = [idx for _, idx in pairs]
            block = values[view.name]
            if idxs != list(range(block.shape[1])):
                block = block[:, idxs]
            blocks.append(pd.DataFrame(block, columns=[r for r, _ in pairs], copy=False))
    wanted = [r for r in refs if r in computed]
    if blocks and len(set(wanted)) == len(wanted) and not set(wanted) & set(result.columns):
        # each view's values join as one block, not one column at a time
        result = pd.concat([result, *blocks], axis=1)
        if list(result.columns[len(labels.columns):]) != wanted:
            result = result[[*labels.columns, *wanted]]
    else:
        for ref in wanted:
            result[ref] = computed[ref]
    apply_transforms(result, transforms, computed)
    return result
