"""Views' values at the label rows' times: by columns where the input allows (each window's
events found per row by ``searchsorted`` over the sorted events of ``keyed``, the arrival
condition as a filter, then ``last`` picked by ``last`` or aggregated by ``aggregates``), else by
the event-by-event replay of ``replay``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from redline.errors import InvalidInput
from redline.features.definitions import FeatureDefinitions, FeatureView
from redline.features.eventfile import EventLog
from redline.features.events import EventDecoder
from redline.features.training.aggregates import aggregate, hll_positions
from redline.features.training.decoded import Decoded, fresh_events
from redline.features.training.ids import LabelIds
from redline.features.training.keyed import gathered, keyed_events, snapshot_events
from redline.features.training.last import SnapshotRows, last_arrived, pick_last, put_last
from redline.features.training.replay import as_log, replay_values


def view_values(dec: Decoded, view: FeatureView, times: np.ndarray, ids: Sequence[str]
                ) -> np.ndarray:
    """(rows, outputs) float64: what a memory store fed the events answers per label row."""
    lay = view.layout()
    nrows = len(times)
    out = np.empty((nrows, len(lay.outputs)), order="F")  # a feature's column is contiguous
    lab = ids if isinstance(ids, LabelIds) else LabelIds.of_texts(ids)
    kinds = {o.kind for o in lay.outputs}
    fresh = fresh_events(dec, view)
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
    snap = snapshot_events(dec, lab, fresh) if any(p[2] for p in plans) else None
    if snap is not None:
        snap_rows = SnapshotRows(dec, snap, lab, times)
        for window, groups, _ in (p for p in plans if p[2]):
            pick_last(dec, groups, out, snap_rows.at(window))
        plans = [p for p in plans if not p[2]]
    if not plans:
        return out
    ev = keyed_events(dec, lab, fresh, "last" in kinds)
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
            found = last_arrived(key, ar, qtimes, qbase + rank(first), right, have, len(sel))
            put_last(dec, ev, groups, out, rows_by_key, found)
            continue
        plan = []
        for g, outs in groups:
            x = ev.values(dec, g.field) if g.field and not g.hll else None
            if g.hll:
                assert g.field is not None
                if g.field not in hll_pos:
                    hll_pos[g.field] = hll_positions(dec, g.field, sel)
            plan.append((outs, x, hll_pos.get(g.field or "") if g.hll else None))
        left = ev.search(qrank, qbase + rank(first))
        lengths = np.where(have, np.maximum(right - left, 0), 0)
        for rows, seg, pos in gathered(left, lengths, ar, qtimes):
            place = rows_by_key[rows]
            for outs, x, hll in plan:
                cols = np.array([i for i, _ in outs])
                out[np.ix_(place, cols)] = aggregate([o for _, o in outs], len(place), seg,
                                                     pos, x, hll)
    return out


def point_in_time(defs: FeatureDefinitions, views: Sequence[FeatureView],
                  events: pd.DataFrame | EventLog | Sequence[Any], times: np.ndarray,
                  ids: Mapping[str, Sequence[str]], method: str = "auto"
                  ) -> dict[str, np.ndarray]:
    """Per view, (rows, outputs) float64 values at ``times`` for ``ids`` (see ``method`` of
    :func:`kernel.build_partition`)."""
    if method not in ("auto", "columns", "replay"):
        raise InvalidInput(f"unknown method {method!r} (use auto, columns or replay)")
    if method != "replay" and len({v.source.name for v in views}) == 1:
        dec = Decoded(EventDecoder(defs, views[0].source.name, views), events)
        if dec.ready:
            return {v.name: view_values(dec, v, times, ids[v.name]) for v in views}
    if method == "columns":
        raise InvalidInput("these events need the event-by-event replay (several sources, "
                           "nested or Redis Stream entries): use method='replay' or 'auto'")
    return replay_values(defs, views, as_log(events), times, ids)
