"""Event validation and the tile updates an event makes: the one path every store ingests by.

An event is a JSON object (or a flat map of strings, as Redis Stream fields and CSV rows arrive)
of one source. :class:`EventDecoder` checks it against the source schema and returns a reason
instead of raising, so a bad event is dead-lettered and ingestion goes on.

This is the one decoder: stream ingest, HTTP push, file replay and the offline training-set
builder all run it, so they agree on types, on which events are admitted (the event time, the
entity id and *every* field of the source schema must be valid: the same rule whichever views
share the source), on what a distinct count counts (``aggregates.value_identity``, per field), and
on the stable id that breaks ``last`` ties after event time and arrival.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from redline.features.aggregates import hll_hash, value_identity
from redline.features.definitions import EventSource, FeatureDefinitions, FeatureView
from redline.features.event_values import (
    MAX_TS_MS,
    MIN_TS_MS,
    coerce,
    entity_id_of,
    event_id_of,
    stable_id,
    to_ms,
)
from redline.features.sessions import SESSION_SOURCE, SessionEvent
from redline.features.updates import (
    KEY_PREFIX,
    STORE_PREFIX,
    Rejected,
    UpdateBatch,
    entity_key,
    store_key,
    view_tag,
)

# the names this module held before the values and the updates moved out, for code that
# imports them from here
__all__ = [
    "KEY_PREFIX", "MAX_TS_MS", "MIN_TS_MS", "STORE_PREFIX", "EventDecoder", "Rejected",
    "UpdateBatch", "entity_id_of", "entity_key", "event_id_of", "raw_bytes", "stable_id",
    "store_key", "to_ms", "view_tag",
]


class _SourcePlan:
    """Per source: the fields to check and, per view, the tile groups an event updates."""

    def __init__(self, source: EventSource, views: Sequence[FeatureView]) -> None:
        self.source = source
        types = source.field_types()
        self.join_key = source.entity.join_key
        self.entity = source.entity.name
        # admission checks every schema field (not only the views' own), so a view version
        # counts the same events whichever other views share the source
        self.event_id = source.event_id
        self.dedup_ms = source.dedup_ms
        self.fields = [(f, t) for f, t in sorted(types.items())
                       if f not in (self.join_key, source.timestamp, source.event_id)]
        self.types = dict(self.fields)
        # the fast path of ``EventDecoder._add``: per field its name, type, and whether it is
        # a float (the common case, decided by one comparison)
        self.checks = [(f, t, t == "float") for f, t in self.fields]
        self.lateness_ms = source.lateness_ms
        self.skew_ms = source.skew_ms
        self.name_bytes = source.name.encode()
        # one value -> (register, rank) cache per field: 3, 3.0 and True are equal dict keys
        self.hll_cache: dict[str, dict[Any, tuple[int, int]]] = {f: {} for f, _ in self.fields}
        # distinct tile grids (tile size, tiles, ring): an event is placed once per grid
        self.grids = sorted({(g.tile_ms, g.tiles, g.ring) for v in views
                             for g in v.layout().groups})
        grid_index = {grid: i for i, grid in enumerate(self.grids)}
        # per grid also its horizon: an event less than ``(tiles - 1) * tile_ms`` behind its
        # arrival is in a tile that reads from its arrival on still cover (``a//t - b//t`` is
        # at most ``(a - b)//t + 1``), so ``tiles.place`` needs no second division for it
        self.grid_spans = [(t, k, r, (k - 1) * t) for t, k, r in self.grids]
        # per view: the key around the entity id, its TTL, its tag and its tile groups
        self.views = [
            (f"{KEY_PREFIX}:{{{self.entity}:", f"}}:{v.name}:{v.version}", v.layout().ttl_ms,
             view_tag(v), [(g.gid, g.field, g.hll, grid_index[(g.tile_ms, g.tiles, g.ring)])
                           for g in v.layout().groups])
            for v in views
        ]
        self.store_head = f"{STORE_PREFIX}:{{{self.entity}:"
        self.store_tail = f"}}:{source.name}"
        # the decoder's loop over them: per view its key around the entity id, TTL and tag, and
        # per tile group (gid, field ("" for a count), kind: 0 count, 1 a float field's value as
        # is, 2 a value to convert, 3 distinct)
        self.view_ops = [
            (head, tail, ttl, tag, [(gid, fld or "", 0 if fld is None else 3 if hll
                                     else 1 if self.types[fld] == "float" else 2, gi)
                                    for gid, fld, hll, gi in groups])
            for head, tail, ttl, tag, groups in self.views
        ]

    def hll(self, name: str, value: Any) -> tuple[int, int]:
        cache = self.hll_cache[name]
        pos = cache.get(value)
        if pos is None:
            if len(cache) > 100_000:
                cache.clear()
            h = hll_hash(value_identity(value, self.types[name]))
            w = h >> 8
            pos = cache[value] = (h & 255, 56 - w.bit_length() + 1)
        return pos

    def stable_id(self, ts: int, eid: str, values: Mapping[str, Any]) -> int:
        parts = [self.name_bytes, str(ts).encode(), eid.encode()]
        parts += [value_identity(values[f], t) for f, t in self.fields]
        return stable_id(parts)


class EventDecoder:
    """Turns raw events into an :class:`UpdateBatch` (accepted) plus dead letters (rejected).

    ``views`` limits the tile updates to those views (the offline builder asks for the ones it
    computes); admission does not depend on it."""

    def __init__(self, defs: FeatureDefinitions, default_source: str | None = None,
                 views: Sequence[FeatureView] | None = None) -> None:
        self.defs = defs
        by_source: dict[str, list[FeatureView]] = {}
        for view in (defs.views.values() if views is None else views):
            by_source.setdefault(view.source.name, []).append(view)
        self.plans = {name: _SourcePlan(defs.sources[name], vs) for name, vs in by_source.items()}
        if default_source is None and len(self.plans) == 1:
            default_source = next(iter(self.plans))
        self.default_source = default_source

    def decode(
        self, raws: Sequence[Any], arrivals_ms: Sequence[int] | int,
        tags: Sequence[int] | None = None, flat: bool | None = None, str_keys: bool = False,
        sink: dict[Any, list[Any]] | None = None,
    ) -> UpdateBatch:
        """Validate ``raws`` (JSON bytes, dicts, flat string maps) arriving at ``arrivals_ms``.

        ``flat=True`` says every value may arrive as a string (CSV rows); by default a map with
        bytes keys (a Redis Stream entry) is flat and anything else is JSON-typed.
        ``str_keys=True`` says every map has text keys (events read from a file), so none needs
        its keys checked for a Redis Stream entry's. With a ``sink`` an accepted event makes no
        ops: its (time, arrival, stable id, entity id, values) go to ``sink[plan]``, for a
        columnar writer (``online.bulk``) to place on the tiles as the ops would be."""
        batch = UpdateBatch()
        n = len(raws)
        arrivals = [arrivals_ms] * n if isinstance(arrivals_ms, int) else arrivals_ms
        for i in range(n):
            tag = tags[i] if tags is not None else i
            raw = raws[i]
            event: Any = None
            if type(raw) is bytes:  # a JSON event, the common case: parsed here, not in _parse
                try:
                    event = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    event = None
                if type(event) is not dict:
                    event = None
            elif str_keys and type(raw) is dict and not (len(raw) == 1 and "d" in raw):
                event = raw
            if event is not None:
                reason = self._add(batch, event, bool(flat), arrivals[i], tag, sink)
            else:
                event, is_flat, reason = self._parse(raw)
                if event is not None:
                    reason = self._add(batch, event, is_flat or bool(flat), arrivals[i], tag,
                                       sink)
            if reason:
                batch.rejected.append(Rejected(reason, raw_bytes(raw), tag))
        return batch

    @staticmethod
    def _parse(raw: Any) -> tuple[Mapping[Any, Any] | None, bool, str]:
        if isinstance(raw, Mapping):
            if b"d" in raw and len(raw) == 1:
                raw = raw[b"d"]
            elif "d" in raw and len(raw) == 1 and isinstance(raw["d"], bytes | str):
                raw = raw["d"]
            else:
                flat = any(isinstance(k, bytes) for k in raw)
                if flat:
                    raw = {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}
                return raw, flat, ""
        if isinstance(raw, bytes | str):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                return None, False, f"unparseable: not valid JSON ({exc})"
            if not isinstance(obj, dict):
                kind = type(obj).__name__
                return None, False, f"unparseable: an event must be a JSON object, got {kind}"
            return obj, False, ""
        return None, False, f"unparseable: an event must be a JSON object, got {type(raw).__name__}"

    def _add(self, batch: UpdateBatch, ev: Mapping[str, Any], flat: bool, arrival: int,
             tag: int, sink: dict[Any, list[Any]] | None = None) -> str:
        # Per event this is most of ingest's Python time, so the common case — a JSON event whose
        # values already have their schema types — is decided inline, by exact type, without the
        # general functions (``to_ms``, ``entity_id_of``, ``coerce``, ``value_identity``,
        # ``admit``, ``place``); anything else goes through them, so the result is the same.
        src_name = ev.get("source", self.default_source)
        if isinstance(src_name, bytes):
            src_name = src_name.decode(errors="replace")
        plan = self.plans.get(src_name) if isinstance(src_name, str) else None
        if plan is None:
            if isinstance(src_name, str) and src_name in self.defs.sources:
                return ""  # a source the chosen views do not read: not an error, nothing to do
            if src_name == SESSION_SOURCE:  # a session item event: for the session store
                batch.sessions.append(SessionEvent(ev, flat, arrival, tag))
                return ""
            known = ", ".join(sorted(self.plans)) or "none: no feature definitions"
            return f"unknown source {src_name!r} (known: {known}); set 'source' in the event"
        src = plan.source
        ts = ev.get(src.timestamp)
        if type(ts) is not int or not MIN_TS_MS <= ts <= MAX_TS_MS:
            ts = to_ms(ts)
            if ts is None:
                if src.timestamp not in ev:
                    return f"missing field '{src.timestamp}' (event time, epoch ms or ISO-8601)"
                got = ev[src.timestamp]
                return (f"field '{src.timestamp}' must be epoch milliseconds or ISO-8601 (years "
                        f"1-9999), got {got!r}")
        eid = ev.get(plan.join_key)
        if type(eid) is not str or not eid:
            eid = entity_id_of(eid)
            if eid is None:
                if plan.join_key not in ev:
                    return f"missing field '{plan.join_key}' (entity '{plan.entity}' id)"
                got = ev[plan.join_key]
                return f"field '{plan.join_key}' must be a string or integer id, got {got!r}"
        # the field values and (without an event id) their identities for the stable id,
        # exactly as ``coerce`` and ``value_identity`` make them
        need_ident = not plan.event_id
        values: dict[str, Any] = {}
        parts = [plan.name_bytes, str(ts).encode(), eid.encode()] if need_ident else []
        for name, typ, is_float in plan.checks:
            if name not in ev:
                return f"missing field '{name}'"
            raw = ev[name]
            if is_float and type(raw) is float and raw - raw == 0.0:  # finite
                v: Any = raw
                if need_ident:
                    parts.append(repr(raw).encode())
            else:
                v = coerce(raw, typ, flat)
                if v is None:
                    return f"field '{name}' must be {typ}, got {raw!r}"
                if need_ident:
                    parts.append(value_identity(v, typ))
            values[name] = v
        lag = arrival - ts
        if lag > plan.lateness_ms:
            return (f"late: arrived {lag} ms after its event time, allowed lateness is "
                    f"{plan.lateness_ms} ms")
        if -lag > plan.skew_ms:
            return (f"future: event time is {-lag} ms ahead of arrival, max clock skew is "
                    f"{plan.skew_ms} ms")
        if plan.event_id:
            ident = event_id_of(ev.get(plan.event_id))
            if ident is None:
                if plan.event_id not in ev:
                    return f"missing field '{plan.event_id}' (the event id)"
                got = ev[plan.event_id]
                return f"field '{plan.event_id}' must be a string or integer id, got {got!r}"
            sid = stable_id([plan.name_bytes, b"id", ident.encode()])
        else:
            sid = stable_id(parts)
        if sink is not None:
            sink[plan].append((ts, arrival, sid, eid, values))
            batch.accepted.append(tag)
            batch.event_ts.append(ts)
            return ""
        ops = batch.ops
        # ``tiles.place`` per tile grid, written out: (tile, slot), or None when no read at or
        # after the arrival can see the tile
        spots: list[tuple[int, int] | None] = []
        for tile_ms, tiles, ring, horizon in plan.grid_spans:
            tile = ts // tile_ms
            if lag < horizon or tile >= arrival // tile_ms - tiles + 1:
                spots.append((tile, tile % ring))
            else:
                spots.append(None)
        key_index = batch.key_index
        for head, tail, ttl, vtag, groups in plan.view_ops:
            k = -1
            for gid, fld, kind, gi in groups:
                where = spots[gi]
                if where is None:
                    continue  # no read at or after its arrival can see this tile
                idx, slot = where
                if k < 0:  # the view's key, named once per event (a list of them cost more)
                    name = head + eid + tail
                    k = key_index.get(name, -1)
                    if k < 0:
                        k = batch.key(name, ttl, plan.dedup_ms,
                                      plan.store_head + eid + plan.store_tail, vtag)
                if kind == 1:  # a float field: its value is a float already
                    ops.append((k, gid, idx, slot, ts, arrival, sid, values[fld], -1, 0, tag))
                elif kind == 0:
                    ops.append((k, gid, idx, slot, ts, arrival, sid, 0.0, -1, 0, tag))
                elif kind == 3:
                    reg, rank = plan.hll(fld, values[fld])
                    ops.append((k, gid, idx, slot, ts, arrival, sid, 0.0, reg, rank, tag))
                else:
                    ops.append((k, gid, idx, slot, ts, arrival, sid, float(values[fld]), -1, 0,
                                tag))
        batch.accepted.append(tag)
        batch.event_ts.append(ts)
        return ""


def raw_bytes(raw: Any) -> bytes:
    """An event as the bytes a dead letter keeps."""
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, str):
        return raw.encode()
    try:
        if isinstance(raw, Mapping):
            return orjson.dumps({(k.decode() if isinstance(k, bytes) else str(k)):
                                 (v.decode(errors="replace") if isinstance(v, bytes) else v)
                                 for k, v in raw.items()}, default=str)
        return orjson.dumps(raw, default=str)
    except TypeError:
        return repr(raw).encode()

