"""The Redis online store: tiles in one hash per (entity, source), merged by Lua in Redis.

Key schema 2 (``rl2:{entity:id}:source``): the hash holds every view version of the source, one
field per tile (``redis_lua`` has the field layout). Keys of schema 1 (``rl:{entity:id}:view:
version``, one hash per view) are ignored and expire by their own TTL.

One read of any number of views for a batch of entities is one EVALSHA — one round trip. Writes
of a batch are one EVALSHA too, atomic: with a stream, the same script checks the entries are
still pending for this consumer, applies their tile updates, acks them and dead-letters the bad
ones, so a consumer killed at any instant neither loses nor double-counts an event.

Against Redis Cluster (``features.redis_cluster: true``) every key of one entity shares the hash
tag ``{entity:id}``, so one entity's views are read by one script call on its shard. A read of
many entities (or of views of two entity types, as the fraud example's card and merchant) makes
one script call per (entity type, slot), pipelined per shard, the shards in parallel: one round
trip per shard; the replies are joined back to rows by key, never by position.

This module is the store: its writes in each mode, on one Redis or a Cluster. Its parts live
beside it: ``redis_client`` (connecting, failures as ``StoreUnavailable``), ``redis_read`` (the
reader), ``redis_write`` (the write script's KEYS and ARGV), ``redis_sent`` (commands whose
reply is read later), ``redis_failover`` and ``redis_lua``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Any

import redis

from redline.errors import ConfigError
from redline.features.definitions import FeatureView
from redline.features.online.base import ReadPlan
from redline.features.online.redis_client import CONNECTION_ERRORS, connect, guarded
from redline.features.online.redis_failover import (
    ClusterPositions,
    SlotMapRefresh,
    batch_tops,
    check_replicas,
    position_key,
    read_positions,
    tops_blob,
)
from redline.features.online.redis_lua import WRITE_SCRIPT
from redline.features.online.redis_read import RedisReader
from redline.features.online.redis_sent import SentCommand, SentWrite
from redline.features.online.redis_write import (
    SEQUENCE_DIGITS,
    cache_key,
    ids_key,
    ops_by_key,
    positioned_call,
    sequence_digits,
    sequenced_call,
    sequenced_head,
    store_keys,
    stream_call,
    write_call,
    write_keys,
)
from redline.features.updates import Rejected, UpdateBatch

# the names this module held before its parts moved out, for code that imports them from here
__all__ = [
    "SEQUENCE_DIGITS", "RedisReader", "RedisStore", "SentCommand", "SentWrite", "cache_key",
    "connect", "guarded", "ids_key", "ops_by_key", "positioned_call", "sequence_digits",
    "sequenced_call", "sequenced_head", "store_keys", "stream_call", "write_call", "write_keys",
]


class RedisStore:
    """Online store in Redis (single server or cluster)."""

    kind = "redis"

    def __init__(self, url: str, *, cluster: bool = False, timeout_ms: float = 50.0,
                 wait_replicas: int = 0, wait_timeout_ms: float = 100.0) -> None:
        self.url = url
        self.cluster = cluster
        # a cluster client connects (to learn the slot map) when it is made
        self.client = guarded(url, lambda: connect(url, cluster=cluster, timeout_ms=timeout_ms))
        self.writer = self.client.register_script(WRITE_SCRIPT)
        self._threads: ThreadPoolExecutor | None = None
        # writes wait until this many replicas hold them (``WAIT``; None: they do not wait)
        self.wait: tuple[int, float] | None = (
            (wait_replicas, wait_timeout_ms) if wait_replicas > 0 else None)
        self.slot_map = SlotMapRefresh(self.client) if cluster else None
        self._positions: ClusterPositions | None = None

    @property
    def cluster_positions(self) -> ClusterPositions:
        """Per-primary position hashes (a cluster store; see ``redis_failover``)."""
        if self._positions is None:
            self._positions = ClusterPositions(self.client)
        return self._positions

    def source_positions(self, topic: str, group: str) -> dict[int, int]:
        """Per partition the highest offset of ``topic`` that ``group`` has applied to the store
        as it is now (after a failover: as the promoted replica has it)."""
        return read_positions(self, topic, group)

    def reader(self, views: Sequence[FeatureView], features: Sequence[str] | None = None,
               cache: bool = True) -> RedisReader:
        """A compiled reader; ``cache=False`` merges every tile on every read (benchmarks)."""
        return RedisReader(self, ReadPlan(views, features), cache)

    def register(self, views: Sequence[FeatureView]) -> None:
        """Nothing to lay out: a reader compiles what it reads (:meth:`reader`)."""

    def add_dead_letters(self, stream: str, rejected: Sequence[Rejected]) -> None:
        """Refused events appended to the stream ``stream`` (the newest ~100,000 kept)."""
        pipe = self.client.pipeline(transaction=False)
        for r in rejected:
            pipe.xadd(stream, {"reason": r.reason, "event": r.raw}, maxlen=100000,
                      approximate=True)
        pipe.execute()

    def write(self, batch: UpdateBatch) -> None:
        """Apply a batch's tile updates atomically (per shard in a cluster)."""
        if not batch.ops:
            return
        if not self.cluster:
            keys, tail = write_call(batch, ("0",))
            self.send(keys, ["0", *tail]).result()
            return
        guarded(self.url, lambda: self._cluster_write(batch))

    def _cluster_write(self, batch: UpdateBatch, head: Sequence[Any] = ("0",),
                       mark: tuple[str, bytes] | None = None) -> None:
        """One atomic script call per slot (every key of one entity shares its hash tag), the
        calls for one shard in one pipeline, shards in parallel. ``mark``: (position hash,
        packed offsets) raised on every primary once its tile writes returned (``WAIT`` after
        it, when configured); else the ``WAIT`` ends each shard's pipeline."""
        assert self.slot_map is not None
        self.slot_map.before_call()
        try:
            self._cluster_write_now(batch, head, mark)
        except CONNECTION_ERRORS:
            self.slot_map.failed()  # the next call refreshes the slot map first
            raise

    def _cluster_write_now(self, batch: UpdateBatch, head: Sequence[Any],
                           mark: tuple[str, bytes] | None) -> None:
        by_slot: dict[int, list[int]] = {}
        for i, key in enumerate(batch.keys):
            by_slot.setdefault(self.client.keyslot(key), []).append(i)
        by_node: dict[str, list[tuple[list[str], list[Any]]]] = {}
        for slot, idxs in by_slot.items():
            sub = UpdateBatch()
            remap = {}
            for i in idxs:
                remap[i] = sub.key(batch.keys[i], batch.key_ttl_ms[i], batch.key_dedup_ms[i],
                                   batch.key_store[i], batch.key_tag[i])
            sub.ops = [(remap[op[0]], *op[1:]) for op in batch.ops if op[0] in remap]  # type: ignore[misc]
            sub.accepted = batch.accepted
            node = self.client.nodes_manager.get_node_from_slot(slot).name
            keys, tail = write_call(sub, head)
            by_node.setdefault(node, []).append((keys, [*head, *tail]))

        wait = self.wait
        if mark is not None:  # every primary records the position, written to or not
            for primary in self.client.get_primaries():
                by_node.setdefault(primary.name, [])

        def run(node_name: str) -> None:
            node = self.client.get_node(node_name=node_name)
            calls = by_node[node_name]
            if calls:
                pipe = node.redis_connection.pipeline(transaction=False)
                for keys, args in calls:
                    self.writer(keys=keys, args=args, client=pipe)
                if wait is not None and mark is None:
                    pipe.execute_command("WAIT", wait[0], int(wait[1]))
                replies = pipe.execute()
                if wait is not None and mark is None:
                    check_replicas(replies[-1], wait, node_name)
            if mark is not None:
                self.cluster_positions.record(node, mark[0], mark[1], wait)

        try:
            list(self._pool().map(run, list(by_node)))
        except redis.ResponseError as exc:
            if "MOVED" not in str(exc) and "ASK" not in str(exc):
                raise
            # slots moved: each call again through the cluster client (writes are idempotent
            # only with positions; a plain write may then apply twice, as any retried write)
            self.client.nodes_manager.initialize()
            if mark is not None:
                # a primary was replaced (a failover): what it acknowledged last may be lost,
                # so the source rewinds to the store's positions and sends it all again
                raise redis.ConnectionError(f"slots moved ({exc}); the source rewinds") from exc
            for calls in by_node.values():
                for keys, args in calls:
                    self.writer(keys=keys, args=args)

    def _pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(8, thread_name_prefix="redline-cluster-write")
        return self._threads

    def write_positioned(self, topic: str, positions: Sequence[tuple[int, int]],
                         batch: UpdateBatch, group: str | None = None) -> None:
        """Exactly-once apply of events from a partitioned log: ``positions[tag]`` is event
        ``tag``'s (partition, offset). Each key records the highest offset per partition applied
        to it in the same atomic script as its tiles, so a replay (a crash before the offsets were
        committed to the log, a rebalance) skips what was applied, on one Redis or a cluster.
        With ``group``, the group's position hash is raised too (``redis_failover``), so a
        consumer can tell where the store stands after a failover (:meth:`source_positions`)."""
        if not batch.ops and group is None:
            return
        key = position_key(topic, group) if group is not None else None
        if not self.cluster:
            self.send(*positioned_call(topic, positions, batch, key)).result()
            return
        head = ["2", topic, array("d", chain.from_iterable(positions)).tobytes()]
        mark = (key, tops_blob(batch_tops(positions))) if key is not None else None
        guarded(self.url, lambda: self._cluster_write(batch, head, mark))

    def write_sequenced(self, stream: str, positions: Sequence[tuple[str, str]],
                        batch: UpdateBatch) -> None:
        """Exactly-once apply of events from a sharded log whose positions are decimal strings
        (Kinesis): ``positions[tag]`` is event ``tag``'s (shard id, sequence number). As
        :meth:`write_positioned`, with the highest sequence number per shard kept exactly."""
        if not batch.ops:
            return
        if not self.cluster:
            self.send(*sequenced_call(stream, positions, batch)).result()
            return
        head = sequenced_head(stream, positions)
        guarded(self.url, lambda: self._cluster_write(batch, head))

    def write_stream_entries(self, ids: Sequence[bytes | str], batch: UpdateBatch,
                             window_ms: int) -> None:
        """Apply Redis Stream entries ``ids`` (tags index into them) so that an entry delivered
        again within ``window_ms`` of its id's time is skipped: each key remembers the entry ids
        applied to it, in the same script as its tiles. This is how stream ingest is exactly-once
        on a cluster, where the stream and the tiles are on different shards."""
        if not batch.ops:
            return
        pairs = []
        for i in ids:
            ms, _, seq = (i.decode() if isinstance(i, bytes) else i).partition("-")
            pairs += [float(ms), float(seq or 0)]
        head = ["3", window_ms, array("d", pairs).tobytes()]
        if not self.cluster:
            keys, tail = write_call(batch, head)
            guarded(self.url, lambda: self.writer(keys=keys, args=[*head, *tail]))
            return
        guarded(self.url, lambda: self._cluster_write(batch, head))

    def write_from_stream(self, stream: str, group: str, consumer: str, ids: Sequence[bytes | str],
                          batch: UpdateBatch) -> tuple[int, int, int]:
        """Exactly-once apply of stream entries ``ids`` (in id order; tags index into them): returns
        (entries acked, events accepted, events dead-lettered) — zeros for entries another
        consumer already claimed."""
        return self.send(*stream_call(stream, group, consumer, ids, batch)).counts()

    def send(self, keys: list[str], args: list[Any]) -> SentWrite:
        """Send a write-script call (KEYS, ARGV as :func:`stream_call` or :func:`write_call`
        build them) and return without waiting for Redis (single Redis, not a cluster)."""
        return guarded(self.url, lambda: SentWrite(self, keys, args))

    def ping(self) -> None:
        """Reachable, and of the kind configured: a cluster node without ``redis_cluster: true``
        answers MOVED to most keys, so it is refused here with the fix named."""
        guarded(self.url, self.client.ping)
        if not self.cluster:
            info = guarded(self.url, lambda: self.client.info("cluster"))
            if int(info.get("cluster_enabled", 0)):
                raise ConfigError(
                    f"{self.url} is a Redis Cluster node: set features.redis_cluster: true in "
                    "redline.yaml (or REDLINE_FEATURES__REDIS_CLUSTER=true)")

    def close(self) -> None:
        self.client.close()
