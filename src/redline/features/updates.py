"""The tile updates a batch of events makes, columnar (:class:`UpdateBatch`), its dead letters,
and the keys the updates go to: one per entity and view in memory, one hash per entity and
source in Redis (key schema 2)."""

from __future__ import annotations

from dataclasses import dataclass, field

from redline.features.definitions import FeatureView
from redline.features.sessions import SessionEvent

KEY_PREFIX = "rl"
# Redis key schema 2: one hash per (entity, source) holds every view's tiles
# (docs/features-reference.md, "Store layouts")
STORE_PREFIX = "rl2"


def entity_key(entity: str, entity_id: str, view: FeatureView) -> str:
    """Memory-store key of one entity's tiles in one view version (also the name a batch gives
    an entity-view); ``{...}`` is the hash tag, so every key of one entity is on one shard."""
    return f"{KEY_PREFIX}:{{{entity}:{entity_id}}}:{view.name}:{view.version}"


def store_key(entity: str, entity_id: str, source: str) -> str:
    """Redis key of one entity's tiles of every view of ``source`` (key schema 2): one hash, so a
    batch touches it once for all the source's views, and a read gets them in one call."""
    return f"{STORE_PREFIX}:{{{entity}:{entity_id}}}:{source}"


def view_tag(view: FeatureView) -> int:
    """A number naming a view version inside a schema-2 hash: 40 bits of its version, times 256
    (the tile group is added), so ``tag + gid`` is exact as a double in Lua and in numpy."""
    return int(view.version[:10], 16) * 256


@dataclass
class Rejected:
    """A dead letter: the raw event, the reason, and where it came from (a stream id or index)."""

    reason: str
    raw: bytes
    tag: int


@dataclass
class UpdateBatch:
    """Tile updates for a batch of events, columnar so stores can apply them without objects.

    ``ops`` rows: (key index, group id, tile index, ring slot, event ts, arrival, stable id,
    value, register, rank, event tag). ``value`` is used by numeric groups, ``register``/``rank``
    by distinct groups (``register`` is -1 for numeric ops).
    """

    keys: list[str] = field(default_factory=list)
    key_ttl_ms: list[int] = field(default_factory=list)
    key_dedup_ms: list[int] = field(default_factory=list)  # event-id window per key (0: off)
    key_index: dict[str, int] = field(default_factory=dict)
    # per key, where Redis keeps it (key schema 2): the (entity, source) hash and the view's tag
    key_store: list[str] = field(default_factory=list)
    key_tag: list[int] = field(default_factory=list)
    ops: list[tuple[int, int, int, int, int, int, int, float, int, int, int]] = field(
        default_factory=list)
    accepted: list[int] = field(default_factory=list)  # tags of accepted events
    # session item events (source "session"): not tiles, handed to the session store
    sessions: list[SessionEvent] = field(default_factory=list)
    event_ts: list[int] = field(default_factory=list)  # their event times (for freshness)
    rejected: list[Rejected] = field(default_factory=list)

    def key(self, name: str, ttl_ms: int, dedup_ms: int = 0, store: str = "", tag: int = 0
            ) -> int:
        i = self.key_index.get(name)
        if i is None:
            i = self.key_index[name] = len(self.keys)
            self.keys.append(name)
            self.key_ttl_ms.append(ttl_ms)
            self.key_dedup_ms.append(dedup_ms)
            self.key_store.append(store)
            self.key_tag.append(tag)
        return i
