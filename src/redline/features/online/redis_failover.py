"""What the Redis store keeps so that a failover costs no event: source positions, replica
acknowledgement (``WAIT``) and the Cluster slot map.

Redis replicates asynchronously: a write the primary acknowledged may be missing on the replica
that takes its place. Replication is in order, though, so a replica holds a *prefix* of its
primary's writes. A partitioned source (Kafka) therefore records, per partition, the highest
offset it applied in a *position hash* (``redline:pos:<topic>:<group>``):

* on one Redis (alone or behind Sentinel) in the same script as the tiles, so whatever a
  promoted replica holds, its position says exactly how far its tiles go;
* on a Cluster, per primary, after that primary's tile scripts returned, in a hash whose hash
  tag lands on the primary's first slot (the promoted replica takes the same slots, so the same
  key): the smallest position over the primaries says how far every shard's tiles go.

A consumer starts each partition from the lower of the group's committed offset and the store's
position + 1: a position behind the committed offset means a failover dropped writes the old
primary had acknowledged, and those messages are read again (the per-key offset marks skip what
the store still has). ``features.redis_wait_replicas`` makes every ingest write wait until that
many replicas hold it (``WAIT``), trading latency for writes no failover can drop.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain, count
from typing import Any

from redline.errors import StoreUnavailable
from redline.features.online.redis_client import guarded
from redline.features.online.redis_lua import lua_text

# Raise per partition the recorded highest offset: lua/positions.lua, the steps of write.lua's
# mode 5 for a Cluster shard that holds no tile of the batch.
POSITION_SCRIPT = lua_text("positions.lua")


def position_key(topic: str, group: str) -> str:
    """The hash of ``group``'s positions in ``topic``: partition -> highest offset applied."""
    return f"redline:pos:{topic}:{group}"


def batch_tops(positions: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Per partition the highest offset among ``positions`` ((partition, offset) per event)."""
    tops: dict[int, int] = {}
    for part, off in positions:
        if off > tops.get(part, -1):
            tops[part] = off
    return tops


def tops_blob(tops: Mapping[int, int]) -> bytes:
    return array("d", chain.from_iterable(tops.items())).tobytes()


def _decode(raw: Mapping[Any, Any]) -> dict[int, int]:
    return {int(k): int(float(v)) for k, v in raw.items()}


# -- Cluster: one position hash per primary --------------------------------------------------

_TAGS: dict[int, str] = {}
_TAGS_LOCK = threading.Lock()


def slot_tag(slot: int) -> str:
    """A short hash tag whose key slot is ``slot`` (found once, then kept)."""
    with _TAGS_LOCK:
        tag = _TAGS.get(slot)
        if tag is None:
            from redis.crc import key_slot

            for i in count():
                if key_slot(str(i).encode()) == slot:
                    tag = _TAGS[slot] = str(i)
                    break
    assert tag is not None
    return tag


def first_slots(client: Any) -> dict[str, int]:
    """Each primary's lowest slot, by node name, from the client's slot map."""
    out: dict[str, int] = {}
    for slot, nodes in client.nodes_manager.slots_cache.items():
        if nodes:
            name = nodes[0].name
            if slot < out.get(name, 16384):
                out[name] = slot
    return out


def node_position_key(base: str, slot: int) -> str:
    return f"{base}:{{{slot_tag(slot)}}}"


class ClusterPositions:
    """Per-primary position hashes of a Redis Cluster store (see the module doc)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._slots: dict[str, int] = {}
        self._primaries: frozenset[str] = frozenset()
        self._script = client.register_script(POSITION_SCRIPT)

    def slots(self) -> dict[str, int]:
        """Primary name -> its lowest slot, recomputed when the set of primaries changes."""
        names = frozenset(n.name for n in self.client.get_primaries())
        if names != self._primaries:
            self._slots = first_slots(self.client)
            self._primaries = names
        return self._slots

    def record(self, node: Any, base: str, blob: bytes, wait: tuple[int, float] | None) -> None:
        """Raise ``node``'s recorded offsets to ``blob``'s (after its tile writes returned)."""
        slot = self.slots().get(node.name)
        if slot is None:  # not a primary of the current map: its writes failed or moved
            return
        from redis.exceptions import NoScriptError

        def send() -> list[Any]:
            pipe = node.redis_connection.pipeline(transaction=False)
            pipe.evalsha(self._script.sha, 1, node_position_key(base, slot), blob)
            if wait is not None:
                pipe.execute_command("WAIT", wait[0], int(wait[1]))
            return pipe.execute()  # type: ignore[no-any-return]

        try:
            replies = send()
        except NoScriptError:  # the node lost its scripts (restarted, flushed, a new primary)
            node.redis_connection.script_load(POSITION_SCRIPT)
            replies = send()
        if wait is not None:
            check_replicas(replies[-1], wait, node.name)

    def read(self, base: str) -> dict[int, int]:
        """Per partition the lowest recorded offset over the primaries. A primary with no
        position hash at all (new after a resharding, or never written) is left out; a
        partition one primary has and another lacks counts as -1 there (read from the start)."""
        hashes = []
        for name, slot in self.slots().items():
            node = self.client.get_node(node_name=name)
            raw = node.redis_connection.hgetall(node_position_key(base, slot))
            if raw:
                hashes.append(_decode(raw))
        out: dict[int, int] = {}
        parts = set(chain.from_iterable(hashes))
        for part in parts:
            out[part] = min(h.get(part, -1) for h in hashes)
        return out


def read_positions(store: Any, topic: str, group: str) -> dict[int, int]:
    """``group``'s positions in ``topic`` as the store holds them now (raises
    ``StoreUnavailable`` when it cannot be read)."""
    key = position_key(topic, group)
    if not store.cluster:
        return _decode(guarded(store.url, lambda: store.client.hgetall(key)))
    store.slot_map.before_call()  # after a failover: the promoted replicas' hashes
    try:
        return guarded(store.url, lambda: store.cluster_positions.read(key))  # type: ignore[no-any-return]
    except StoreUnavailable:
        store.slot_map.failed()
        raise


def start_offsets(committed: Mapping[int, int], stored: Mapping[int, int],
                  partitions: Sequence[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Where each partition starts: the lower of the committed offset (negative: none) and the
    store's position + 1; and, per partition where the store is behind the committed offset,
    how many messages that replays (writes a failover dropped)."""
    start: dict[int, int] = {}
    behind: dict[int, int] = {}
    for part in partitions:
        done = committed.get(part, -1)
        pos = stored.get(part)
        if pos is None:
            if done >= 0:
                start[part] = done
            continue
        if done < 0 or pos + 1 < done:
            start[part] = pos + 1
            if done >= 0:
                behind[part] = done - (pos + 1)
        else:
            start[part] = done
    return start, behind


# -- WAIT ---------------------------------------------------------------------------------------

def check_replicas(reply: Any, wait: tuple[int, float], where: str) -> None:
    """Raise ``StoreUnavailable`` when ``WAIT`` saw fewer replicas than asked for."""
    got = int(reply)
    if got < wait[0]:
        raise StoreUnavailable(
            f"Redis at {where}: {got} of {wait[0]} replica(s) acknowledged the write within "
            f"{wait[1]:.0f} ms (features.redis_wait_replicas); it is applied on the primary and "
            "is sent again from the source's position once the replicas keep up")


# -- Cluster slot map -----------------------------------------------------------------------------

class SlotMapRefresh:
    """After a connection error on a node of a Redis Cluster, refresh the client's slot map
    before the next call, at most every ``interval_s``: the failed node's replica may have taken
    its slots (redis-py's own commands do this; the store's pipelined script calls go to nodes
    directly and need it too)."""

    def __init__(self, client: Any, interval_s: float = 0.2) -> None:
        self.client = client
        self.interval_s = interval_s
        self.stale = False
        self._last = 0.0
        self._lock = threading.Lock()

    def failed(self) -> None:
        self.stale = True

    def before_call(self) -> None:
        if not self.stale:
            return
        with self._lock:
            now = time.monotonic()
            if not self.stale or now - self._last < self.interval_s:
                return
            self._last = now
            try:
                self.client.nodes_manager.initialize()
                self.stale = False
            except Exception:  # noqa: BLE001 - no node answered yet: the call fails as it would
                pass
