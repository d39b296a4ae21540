"""Event validation and the tile updates an event makes: the one path every store ingests by.

An event is a JSON object (or a flat map of strings, as Redis Stream fields arrive) of one
source. :class:`EventDecoder` checks it against the source schema and returns a reason instead
of raising, so a bad event is dead-lettered and ingestion goes on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from redline.features.aggregates import hll_position
from redline.features.definitions import EventSource, FeatureDefinitions, FeatureView
from redline.features.tiles import admit, place

KEY_PREFIX = "rl"


def entity_key(entity: str, entity_id: str, view: FeatureView) -> str:
    """Redis/memory key of one entity's tiles in one view version; ``{...}`` is the hash tag, so
    every view of one entity lives on one Redis Cluster shard."""
    return f"{KEY_PREFIX}:{{{entity}:{entity_id}}}:{view.name}:{view.version}"


@dataclass
class Rejected:
    """A dead letter: the raw event, the reason, and where it came from (a stream id or index)."""

    reason: str
    raw: bytes
    tag: int


@dataclass
class UpdateBatch:
    """Tile updates for a batch of events, columnar so stores can apply them without objects.

    ``ops`` rows: (key index, group id, tile index, ring slot, event ts, value, register, rank,
    event tag). ``value`` is used by numeric groups, ``register``/``rank`` by distinct groups
    (``register`` is -1 for numeric ops).
    """

    keys: list[str] = field(default_factory=list)
    key_ttl_ms: list[int] = field(default_factory=list)
    key_index: dict[str, int] = field(default_factory=dict)
    ops: list[tuple[int, int, int, int, int, float, int, int, int]] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # tags of accepted events
    event_ts: list[int] = field(default_factory=list)  # their event times (for freshness)
    rejected: list[Rejected] = field(default_factory=list)

    def key(self, name: str, ttl_ms: int) -> int:
        i = self.key_index.get(name)
        if i is None:
            i = self.key_index[name] = len(self.keys)
            self.keys.append(name)
            self.key_ttl_ms.append(ttl_ms)
        return i


def _to_ms(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, str | bytes):
        text = value.decode() if isinstance(value, bytes) else value
        try:
            return int(text)
        except ValueError:
            pass
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return int(dt.timestamp() * 1000)
    return None


def _coerce(value: Any, typ: str, flat: bool) -> Any:
    """Value of a schema type, or ``None`` when it is not one (strings only from flat maps)."""
    if flat and isinstance(value, bytes | str):
        text = value.decode() if isinstance(value, bytes) else value
        try:
            if typ == "int":
                return int(text)
            if typ == "float":
                x = float(text)
                return x if math.isfinite(x) else None
            if typ == "bool":
                return {"true": True, "false": False, "1": True, "0": False}.get(text.lower())
        except ValueError:
            return None
        return text
    if typ == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            x = float(value)
            return x if math.isfinite(x) else None
        return None
    if typ == "int":  # an integral float (2.0) is an int, as in the offline builder's columns
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if typ == "bool":
        return value if isinstance(value, bool) else None
    return value if isinstance(value, str) else None


class _SourcePlan:
    """Per source: the fields to check and, per view, the tile groups an event updates."""

    def __init__(self, source: EventSource, views: Sequence[FeatureView]) -> None:
        self.source = source
        types = source.field_types()
        self.join_key = source.entity.join_key
        self.entity = source.entity.name
        used = {a.field for v in views for a in v.features if a.field}
        self.fields = [(f, types[f]) for f in sorted(used)]
        self.lateness_ms = source.lateness_ms
        self.skew_ms = source.skew_ms
        # distinct tile grids (tile size, tiles, ring): an event is placed once per grid
        self.grids = sorted({(g.tile_ms, g.tiles, g.ring) for v in views
                             for g in v.layout().groups})
        grid_index = {grid: i for i, grid in enumerate(self.grids)}
        # per view: the key around the entity id, its TTL, and its tile groups
        self.views = [
            (f"{KEY_PREFIX}:{{{self.entity}:", f"}}:{v.name}:{v.version}", v.layout().ttl_ms,
             [(g.gid, g.field, g.hll, grid_index[(g.tile_ms, g.tiles, g.ring)])
              for g in v.layout().groups])
            for v in views
        ]


class EventDecoder:
    """Turns raw events into an :class:`UpdateBatch` (accepted) plus dead letters (rejected)."""

    def __init__(self, defs: FeatureDefinitions, default_source: str | None = None) -> None:
        self.defs = defs
        by_source: dict[str, list[FeatureView]] = {}
        for view in defs.views.values():
            by_source.setdefault(view.source.name, []).append(view)
        self.plans = {name: _SourcePlan(defs.sources[name], vs) for name, vs in by_source.items()}
        if default_source is None and len(self.plans) == 1:
            default_source = next(iter(self.plans))
        self.default_source = default_source
        self._hll_cache: dict[Any, tuple[int, int]] = {}

    def decode(
        self, raws: Sequence[Any], arrivals_ms: Sequence[int] | int,
        tags: Sequence[int] | None = None,
    ) -> UpdateBatch:
        """Validate ``raws`` (JSON bytes, dicts, flat string maps) arriving at ``arrivals_ms``."""
        batch = UpdateBatch()
        n = len(raws)
        arrivals = [arrivals_ms] * n if isinstance(arrivals_ms, int) else arrivals_ms
        for i in range(n):
            tag = tags[i] if tags is not None else i
            raw = raws[i]
            event, flat, reason = self._parse(raw)
            if event is not None:
                reason = self._add(batch, event, flat, arrivals[i], tag)
            if reason:
                batch.rejected.append(Rejected(reason, _raw_bytes(raw), tag))
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
             tag: int) -> str:
        src_name = ev.get("source", self.default_source)
        if isinstance(src_name, bytes):
            src_name = src_name.decode()
        plan = self.plans.get(src_name) if isinstance(src_name, str) else None
        if plan is None:
            known = ", ".join(sorted(self.plans))
            return f"unknown source {src_name!r} (known: {known}); set 'source' in the event"
        src = plan.source
        ts = _to_ms(ev.get(src.timestamp))
        if ts is None:
            if src.timestamp not in ev:
                return f"missing field '{src.timestamp}' (event time, epoch ms or ISO-8601)"
            got = ev[src.timestamp]
            return f"field '{src.timestamp}' must be epoch milliseconds or ISO-8601, got {got!r}"
        eid = ev.get(plan.join_key)
        if isinstance(eid, bytes):
            eid = eid.decode()
        if isinstance(eid, int) and not isinstance(eid, bool):
            eid = str(eid)
        if not isinstance(eid, str) or not eid:
            if plan.join_key not in ev:
                return f"missing field '{plan.join_key}' (entity '{plan.entity}' id)"
            return f"field '{plan.join_key}' must be a string or integer id, got {eid!r}"
        values: dict[str, Any] = {}
        for name, typ in plan.fields:
            if name not in ev:
                return f"missing field '{name}'"
            v = _coerce(ev[name], typ, flat)
            if v is None:
                return f"field '{name}' must be {typ}, got {ev[name]!r}"
            values[name] = v
        why = admit(ts, arrival, plan.lateness_ms, plan.skew_ms)
        if why == "late":
            return (f"late: arrived {arrival - ts} ms after its event time, allowed lateness is "
                    f"{plan.lateness_ms} ms")
        if why == "future":
            return (f"future: event time is {ts - arrival} ms ahead of arrival, max clock skew is "
                    f"{plan.skew_ms} ms")
        ops = batch.ops
        hll_cache = self._hll_cache  # distinct values repeat (merchants, devices): hash once
        spots = [place(ts, arrival, tile_ms, tiles, ring) for tile_ms, tiles, ring in plan.grids]
        for head, tail, ttl, groups in plan.views:
            k = -1
            for gid, fld, hll, gi in groups:
                where = spots[gi]
                if where is None:
                    continue  # no read at or after its arrival can see this tile
                idx, slot = where
                if k < 0:
                    k = batch.key(head + eid + tail, ttl)
                if fld is None:
                    ops.append((k, gid, idx, slot, ts, 0.0, -1, 0, tag))
                elif hll:
                    val = values[fld]
                    pos = hll_cache.get(val)
                    if pos is None:
                        if len(hll_cache) > 100_000:
                            hll_cache.clear()
                        pos = hll_cache[val] = hll_position(val)
                    ops.append((k, gid, idx, slot, ts, 0.0, pos[0], pos[1], tag))
                else:
                    ops.append((k, gid, idx, slot, ts, float(values[fld]), -1, 0, tag))
        batch.accepted.append(tag)
        batch.event_ts.append(ts)
        return ""


def _raw_bytes(raw: Any) -> bytes:
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
