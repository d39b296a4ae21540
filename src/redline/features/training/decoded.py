"""The admitted events of one source as columns: what the decoder would apply, decided for
every event at once (types, ids, time, lateness and skew), and which of them a view's key applies
after its event-id dedup window.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.features.definitions import FeatureView
from redline.features.event_values import entity_id_of, event_id_of, stable_id
from redline.features.eventfile import ARRIVAL
from redline.features.events import EventDecoder
from redline.features.tiles import admitted_array
from redline.features.training.columns import ALL_VALID, Field, columns, times_ms
from redline.features.training.ids import Ids, LabelIds, as_int64


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
        self.orders: dict[Any, Any] = {}  # the last views' sorted events (see keyed_events)
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
        if ent.ok is not ALL_VALID:
            ok &= ent.ok
        self.fields = {f: Field(cols[f], t, flat) for f, t in plan.fields}
        for fld in self.fields.values():
            if fld.ok is not ALL_VALID:
                ok &= fld.ok
        if plan.event_id:
            ev = Ids(cols[plan.event_id], event_id_of)
            if ev.ok is not ALL_VALID:
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


def fresh_events(dec: Decoded, view: FeatureView) -> np.ndarray:
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
