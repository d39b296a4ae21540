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
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Any, TypeVar

import numpy as np
import redis
import redis.cluster
from redis.commands.core import Script

from redline.errors import ConfigError, StoreUnavailable
from redline.features.definitions import FeatureView
from redline.features.events import UpdateBatch, store_key
from redline.features.online.base import EntityIds, ReadPlan, now_ms
from redline.features.online.redis_failover import (
    ClusterPositions,
    SlotMapRefresh,
    batch_tops,
    check_replicas,
    position_key,
    read_positions,
    tops_blob,
)
from redline.features.online.redis_lua import WRITE_SCRIPT, read_script, source_groups
from redline.features.online.redis_sentinel import is_sentinel_url, sentinel_client

T = TypeVar("T")
_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.cluster.ClusterDownError,
           redis.exceptions.ClusterError, redis.exceptions.RedisClusterException,
           redis.exceptions.MasterDownError, redis.exceptions.TryAgainError, OSError)


def connect(url: str, *, cluster: bool = False, timeout_ms: float = 50.0) -> Any:
    """A redis-py client (or cluster client) for ``url``; the factory sessions reuse too. A
    ``redis+sentinel://`` URL gives a client of the service's current primary, which follows a
    failover (``redis_sentinel``)."""
    timeout = timeout_ms / 1000.0
    kw = dict(socket_timeout=timeout, socket_connect_timeout=max(timeout, 0.5))
    if is_sentinel_url(url):
        if cluster:
            raise ConfigError(f"{url} names a Sentinel service (one primary and its replicas); "
                              "set features.redis_cluster: false, or name a Cluster node instead")
        return sentinel_client(url, **kw)
    if cluster:
        return redis.RedisCluster.from_url(url, **kw)
    return redis.Redis.from_url(url, **kw)


def guarded(url: str, fn: Callable[[], T]) -> T:
    """Run ``fn``; a connection failure becomes :class:`StoreUnavailable` naming the URL."""
    try:
        return fn()
    except _ERRORS as exc:
        raise StoreUnavailable(
            f"Redis online store at {url} is unavailable ({type(exc).__name__}: {exc}); check that "
            "redis-server runs and features.redis_url points at it"
        ) from exc


def cache_key(key: str) -> str:
    """Where a key's last read result is cached (same hash tag, so the same shard)."""
    return key + ":m"


def ids_key(key: str) -> str:
    """The event ids a key has counted, for deduplication (same hash tag, so the same shard)."""
    return key + ":e"


def write_keys(keys: Sequence[str], ids: bool = True) -> list[str]:
    """KEYS of the write script for these tile keys: tiles, result caches and — only when the
    write deduplicates (``ids``) — the keys' event-id sets."""
    if not ids:
        return [*keys, *map(cache_key, keys)]
    return [*keys, *map(cache_key, keys), *map(ids_key, keys)]


def _key_parts(views: Sequence[FeatureView]) -> list[tuple[int, str, str]]:
    """Per hash of :func:`redis_lua.source_groups`: a view whose ids name it, and the key
    around the id."""
    out = []
    for group in source_groups(views):
        v = views[group[0]]
        head, _, tail = store_key(v.entity.name, "\0", v.source.name).partition("\0")
        out.append((group[0], head, tail))
    return out


def _row_keys(parts: list[tuple[int, str, str]], cols: Sequence[Sequence[str]],
              rows: Sequence[int], cache: bool) -> list[str]:
    """KEYS of a read of ``rows``: per row its hashes, then (``cache``) their result caches."""
    keys: list[str] = []
    for r in rows:
        row = [head + cols[j][r] + tail for j, head, tail in parts]
        keys += row
        if cache:
            keys += [k + ":m" for k in row]
    return keys


class RedisReader:
    def __init__(self, store: RedisStore, plan: ReadPlan, cache: bool = True) -> None:
        self.store = store
        self.plan = plan
        self.cache = cache
        self.parts = _key_parts(plan.views)
        self.script: Script = store.client.register_script(read_script(plan.views, cache))
        self.view_windows = [[w.window for w in v.layout().windows] for v in plan.views]
        try:  # load now so the first read is one round trip (NOSCRIPT is retried if Redis restarts)
            if not store.cluster:
                store.client.script_load(self.script.script)
        except _ERRORS:
            pass  # Redis is down now: the first read raises StoreUnavailable
        self.windows = [w.window for v in plan.views for w in v.layout().windows]
        # every window's covering tiles change only when ``now // _args_step`` does
        self._args_step = math.gcd(*(w.tile_ms for w in self.windows))
        self._args_memo: tuple[int, tuple[Any, ...]] | None = None
        # a row of the reply: any data, every view's outputs, one newest event time per view
        self.row_width = 1 + plan.width + len(plan.views)
        if store.cluster:
            self.cluster = _ClusterRead(self, cache)

    def _args(self, now: int, views: Sequence[int] | None = None) -> list[Any]:
        if views is None:  # the same for every read until a tile boundary: kept (~12 us a read)
            step = now // self._args_step
            memo = self._args_memo
            if memo is not None and memo[0] == step:
                return list(memo[1])
            args = self._args_of(now, range(len(self.plan.views)))
            self._args_memo = (step, tuple(args))
            return args
        return self._args_of(now, views)

    def _args_of(self, now: int, picked: Sequence[int]) -> list[Any]:
        # with the cache: per view its signature ("#t": the cached result's layout — outputs,
        # then the newest event time); then every window's (lo, hi) as packed doubles, one
        # argument (measured: 13 us less a call than 20 numbers and 10 replies, an empty script)
        args: list[Any] = [
            "|".join(str(w.covering(now)[1]) for w in self.view_windows[j]) + "#t"
            for j in picked] if self.cache else []
        bounds = array("d")
        for j in picked:
            for w in self.view_windows[j]:
                bounds.extend(w.covering(now))
        args.append(bounds.tobytes())
        return args

    def read(self, ids: EntityIds, now: int | None = None, dtype: type = np.float32
             ) -> tuple[np.ndarray, np.ndarray]:
        feats, missing, _ = self.read_timed(ids, now, dtype)
        return feats, missing

    def read_timed(self, ids: EntityIds, now: int | None = None, dtype: type = np.float32
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`read` and, per row and view, the newest event time (epoch ms, NaN: none) of
        the tiles the read merged — the feature age at read is ``now`` minus it."""
        if self.store.cluster:
            now = now_ms() if now is None else now
            n, cols = self.plan.ids_per_view(ids)
            slot_map = self.store.slot_map
            assert slot_map is not None
            slot_map.before_call()  # after a failed call: the replica may own its slots now
            try:
                flat = guarded(self.store.url, lambda: self.cluster.read(n, cols, now))
            except StoreUnavailable:
                slot_map.failed()
                raise
            return self._split(flat, dtype)
        n, keys, args = self.command(ids, now)
        reply = guarded(self.store.url, lambda: self.script(keys=keys, args=args))
        return self.decode_timed(reply, n, dtype)

    def command(self, ids: EntityIds, now: int | None = None
                ) -> tuple[int, list[str], list[Any]]:
        """One read (single Redis, not a cluster) as the script's (rows, KEYS, ARGV), for a
        caller that sends it on its own connection (``serving``'s event-loop reader) as
        ``EVALSHA self.script.sha`` and parses the reply with :meth:`decode`."""
        now = now_ms() if now is None else now
        n, cols = self.plan.ids_per_view(ids)
        return n, _row_keys(self.parts, cols, range(n), self.cache), self._args(now)

    def decode(self, reply: bytes, n: int, dtype: type = np.float32
               ) -> tuple[np.ndarray, np.ndarray]:
        """The script's reply for ``n`` rows as (features, missing), as :meth:`read` returns."""
        feats, missing, _ = self.decode_timed(reply, n, dtype)
        return feats, missing

    def decode_timed(self, reply: bytes, n: int, dtype: type = np.float32
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The script's reply (one string: every row's doubles) as :meth:`read_timed` returns
        it."""
        return self._split(np.frombuffer(reply, dtype="<f8").reshape(n, self.row_width), dtype)

    def _split(self, flat: np.ndarray, dtype: type
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        width = self.plan.width
        with np.errstate(over="ignore"):  # beyond float32's range is ±inf, as documented
            feats: np.ndarray = flat[:, 1:1 + width][:, self.plan.take].astype(dtype)
        return feats, flat[:, 0] == 0, flat[:, 1 + width:]


class _ClusterRead:
    """Reads on Redis Cluster: the views are grouped by entity type (their hashes share one hash
    tag per entity id); each (group, slot) is one script call with only that slot's keys, the
    calls for one shard go in one pipeline, shards in parallel; replies are placed by key."""

    def __init__(self, reader: RedisReader, cache: bool) -> None:
        self.reader = reader
        plan = reader.plan
        client = reader.store.client
        by_entity: dict[str, list[int]] = {}
        for j, v in enumerate(plan.views):
            by_entity.setdefault(v.entity.name, []).append(j)
        self.groups = list(by_entity.values())
        self.cache = cache
        self.scripts = [client.register_script(read_script([plan.views[j] for j in g], cache))
                        for g in self.groups]
        # per group: its hashes' key parts, with view indices of the whole plan
        self.parts = []
        for g in self.groups:
            sub = _key_parts([plan.views[j] for j in g])
            self.parts.append([(g[j], head, tail) for j, head, tail in sub])
        widths = [len(v.layout().outputs) for v in plan.views]
        self.offsets = np.cumsum([0, *widths])  # view j's outputs in a row: offsets[j]..[j+1]
        self.pool = ThreadPoolExecutor(8, thread_name_prefix="redline-cluster-read")

    def read(self, n: int, cols: Sequence[Sequence[str]], now: int) -> np.ndarray:
        reader = self.reader
        client = reader.store.client
        out = np.zeros((n, reader.row_width), dtype=np.float64)
        # (group, slot) -> rows; a call's keys are one slot's, per row: hashes then caches
        calls: dict[tuple[int, int], list[int]] = {}
        for gi, parts in enumerate(self.parts):
            j, head, tail = parts[0]
            for r in range(n):
                calls.setdefault((gi, client.keyslot(head + cols[j][r] + tail)), []).append(r)
        args = [reader._args(now, g) for g in self.groups]
        by_node: dict[str, list[tuple[int, int, list[int]]]] = {}
        for (gi, slot), rows in calls.items():
            node = client.nodes_manager.get_node_from_slot(slot)
            by_node.setdefault(node.name, []).append((gi, slot, rows))

        def run(node_name: str) -> list[tuple[int, list[int], bytes]]:
            todo = by_node[node_name]
            node = client.get_node(node_name=node_name)
            calls = [(self.scripts[gi], _row_keys(self.parts[gi], cols, rows, self.cache),
                      args[gi]) for gi, _slot, rows in todo]
            replies = _evalsha_pipeline(node.redis_connection, calls)
            return [(gi, rows, rep) for (gi, _s, rows), rep in zip(todo, replies, strict=True)]

        try:
            if len(by_node) == 1:
                results = [run(next(iter(by_node)))]
            else:
                results = list(self.pool.map(run, list(by_node)))
        except redis.ResponseError as exc:
            if "MOVED" not in str(exc) and "ASK" not in str(exc):
                raise
            # the slots moved (failover, resharding): refresh the map, one call at a time
            client.nodes_manager.initialize()
            results = [[(gi, rows, self.scripts[gi](
                keys=_row_keys(self.parts[gi], cols, rows, self.cache), args=args[gi]))
                        for gi, _slot, rows in todo] for todo in by_node.values()]
        width = int(self.offsets[-1])
        for node_results in results:
            for gi, rows, reply in node_results:
                per_row = np.frombuffer(reply, dtype="<f8").reshape(len(rows), -1)
                for r, vals in zip(rows, per_row, strict=True):
                    out[r, 0] = max(out[r, 0], vals[0])
                    pos = 1
                    for j in self.groups[gi]:
                        w = int(self.offsets[j + 1] - self.offsets[j])
                        out[r, 1 + self.offsets[j]:1 + self.offsets[j + 1]] = vals[pos:pos + w]
                        pos += w
                    for j in self.groups[gi]:  # then the group's newest event times
                        out[r, 1 + width + j] = vals[pos]
                        pos += 1
        return out


def _evalsha_pipeline(conn: redis.Redis, calls: Sequence[tuple[Script, list[str], list[Any]]]
                      ) -> list[Any]:
    """The script calls in one pipeline on one node: one round trip. EVALSHA is sent straight
    away (a redis-py ``Script`` in a pipeline asks ``SCRIPT EXISTS`` first, a round trip more);
    a node that lost a script (restarted, flushed) answers NOSCRIPT, and those calls are made
    again once the script is loaded there."""
    def send(which: Sequence[int]) -> list[Any]:
        pipe = conn.pipeline(transaction=False)
        for i in which:
            script, keys, argv = calls[i]
            pipe.evalsha(script.sha, len(keys), *keys, *argv)
        return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]

    replies = send(range(len(calls)))
    lost = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
    if lost:
        for script in {id(calls[i][0]): calls[i][0] for i in lost}.values():
            conn.script_load(script.script)
        for i, reply in zip(lost, send(lost), strict=True):
            replies[i] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def store_keys(batch: UpdateBatch) -> tuple[list[str], list[int], list[int], list[int]]:
    """The batch's (entity, source) hashes (key schema 2), each batch key's index among them,
    and per hash its TTL and event-id window (the largest of its views')."""
    index: dict[str, int] = {}
    kmap = [index.setdefault(skey, len(index)) for skey in batch.key_store]
    n = len(index)
    if n == len(kmap):  # one view per hash: nothing to combine
        return list(index), kmap, list(batch.key_ttl_ms), list(batch.key_dedup_ms)
    ttl = [0] * n
    dedup = [0] * n
    for i, t, d in zip(kmap, batch.key_ttl_ms, batch.key_dedup_ms, strict=True):
        if t > ttl[i]:
            ttl[i] = t
        if d > dedup[i]:
            dedup[i] = d
    return list(index), kmap, ttl, dedup


def write_call(batch: UpdateBatch, head: Sequence[Any]) -> tuple[list[str], list[Any]]:
    """KEYS (the hashes, their read caches, their event-id sets when needed) and the ARGV tail
    shared by plain and stream writes: accepted tags, dead letters, TTLs, dedup windows, then
    the tile updates (see ``redis_lua.WRITE_SCRIPT`` and :func:`ops_by_key`)."""
    skeys, kmap, ttl, dedup = store_keys(batch)
    args: list[Any] = [array("d", batch.accepted).tobytes(), len(batch.rejected)]
    for r in batch.rejected:
        args += [r.tag, r.reason.split(":", 1)[0].split(" ", 1)[0], r.reason, r.raw]
    args.append(array("d", ttl).tobytes())
    args.append(array("d", dedup).tobytes())
    args += ops_by_key(batch.ops, kmap, batch.key_tag)
    ids = head[0] == "3" or any(dedup)
    return write_keys(skeys, ids), args


# One tile update as the write script reads it (``struct.unpack('<dIddhBI')``, 35 bytes): group
# tag (view tag + group id, see ``events.view_tag``), ring slot, tile index, value, HyperLogLog
# register (-1: numeric) and rank, event tag. What is the same for every update of an event
# (event time, arrival, stable id) is sent once per event.
_OP = np.dtype([("grp", "<f8"), ("slot", "<u4"), ("idx", "<f8"), ("x", "<f8"), ("reg", "<i2"),
                ("rank", "u1"), ("tag", "<u4")])


# ``UpdateBatch.ops`` rows as the decoder makes them: integers, but the value
_OP_IN = struct.Struct("<qqqqqqqdqqq")
_OP_IN_NAMES = ("k", "gid", "idx", "slot", "ts", "ar", "sid", "x", "reg", "rank", "tag")
_OP_IN_DT = np.dtype([(name, "<f8" if name == "x" else "<i8") for name in _OP_IN_NAMES])


def ops_by_key(ops: Sequence[Sequence[float]], kmap: Sequence[int], tags: Sequence[int]
               ) -> list[bytes]:
    """``UpdateBatch.ops`` for the write script: the updates sorted by hash (``kmap``: batch key
    -> hash) — stably, so every tile is updated in the events' order — as packed :data:`_OP`
    records; the runs (hash, count); and per event tag its (event time, arrival, stable id) as
    packed doubles. Compact because Redis's Lua hashes every byte of every argument (measured:
    880 → 314 bytes an event for 5 views)."""
    if not ops:
        return [b"", b"", b""]
    try:  # one C call an update (a quarter of the time of a generic float array, measured)
        pack = _OP_IN.pack
        rows = np.frombuffer(b"".join([pack(*op) for op in ops]), dtype=_OP_IN_DT)
        flat = np.empty((len(rows), 11), dtype=np.float64)
        for i, name in enumerate(_OP_IN_NAMES):
            flat[:, i] = rows[name]
    except struct.error:  # not all integers where they usually are: the generic way
        flat = np.frombuffer(array("d", chain.from_iterable(ops)),
                             dtype=np.float64).reshape(-1, 11)
    k = flat[:, 0].astype(np.intp)
    keys = np.asarray(kmap, dtype=np.float64)[k]
    grp = np.asarray(tags, dtype=np.float64)[k] + flat[:, 1]
    if len(keys) > 1 and (keys[1:] < keys[:-1]).any():
        order = np.argsort(keys, kind="stable")
        flat, keys, grp = flat[order], keys[order], grp[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    counts = np.diff(np.r_[starts, len(keys)])
    runs = np.column_stack((keys[starts], counts)).astype(np.float64)
    rec = np.empty(len(flat), dtype=_OP)
    rec["grp"], rec["idx"], rec["slot"] = grp, flat[:, 2], flat[:, 3]
    rec["x"], rec["reg"], rec["rank"] = flat[:, 7], flat[:, 8], flat[:, 9]
    tags_ = flat[:, 10].astype(np.int64)
    rec["tag"] = tags_
    events = np.zeros((int(tags_.max()) + 1, 3), dtype=np.float64)
    events[tags_] = flat[:, 4:7]
    return [rec.tobytes(), runs.tobytes(), events.tobytes()]


def stream_call(stream: str, group: str, consumer: str, ids: Sequence[bytes | str],
                batch: UpdateBatch) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of the write script applying stream entries ``ids`` exactly once (mode 1)."""
    skeys, tail = write_call(batch, ("1",))
    keys = [stream, f"{stream}:dead", f"{stream}:stats", *skeys]
    return keys, ["1", group, consumer, len(ids), ids[0], ids[-1], *ids, *tail]


def positioned_call(topic: str, positions: Sequence[tuple[int, int]], batch: UpdateBatch,
                    position_key: str | None = None) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of the write script applying events of a partitioned log exactly once
    (mode 2; ``positions[tag]`` is event ``tag``'s (partition, offset)); with ``position_key``
    (mode 5, one Redis) the batch's highest offset per partition is raised in that hash in the
    same step (``redis_failover``)."""
    blob = array("d", chain.from_iterable(positions)).tobytes()
    if position_key is None:
        head = ["2", topic, blob]
        keys, tail = write_call(batch, head)
        return keys, [*head, *tail]
    head = ["5", topic, blob, tops_blob(batch_tops(positions))]
    keys, tail = write_call(batch, head)
    return [position_key, *keys], [*head, *tail]


SEQUENCE_DIGITS = 129  # a Kinesis sequence number: 0|([1-9][0-9]{0,128}) (its API reference)


def sequence_digits(seq: str) -> str:
    """A sequence number as the write script compares and stores it: 129 decimal digits,
    zero-padded, so the order of the strings is the order of the numbers, exactly."""
    if not seq.isdigit() or not seq.isascii() or len(seq) > SEQUENCE_DIGITS:
        raise ValueError(f"a sequence number is up to {SEQUENCE_DIGITS} decimal digits, got "
                         f"{seq[:40]!r}")
    return seq.rjust(SEQUENCE_DIGITS, "0")


def sequenced_head(stream: str, positions: Sequence[tuple[str, str]]) -> list[Any]:
    """The head of the write script's mode 4 (a sharded log whose positions are decimal numbers
    beyond 2^53, such as Kinesis): ``positions[tag]`` is event ``tag``'s (shard id, sequence
    number as its decimal string)."""
    shards: dict[str, int] = {}
    index = [str(shards.setdefault(shard, len(shards))) for shard, _ in positions]
    digits = "".join([sequence_digits(seq) for _, seq in positions])
    return ["4", stream, ",".join(index), digits, ",".join(shards)]


def sequenced_call(stream: str, positions: Sequence[tuple[str, str]], batch: UpdateBatch
                   ) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of the write script applying events of a sharded log exactly once (mode 4;
    see :func:`sequenced_head`)."""
    head = sequenced_head(stream, positions)
    keys, tail = write_call(batch, head)
    return keys, [*head, *tail]


class SentCommand:
    """A command sent on a connection of its own, its reply read later (:meth:`result`);
    ``then``: commands sent right behind it on the same connection (``WAIT``), their replies
    read by :meth:`result` too (``self.then_replies``)."""

    def __init__(self, store: RedisStore, *args: Any,
                 then: Sequence[Sequence[Any]] = ()) -> None:
        self.store = store
        self.pool = store.client.connection_pool
        self.then = len(then)
        self.then_replies: list[Any] = []
        self.conn: Any = self.pool.get_connection()
        try:
            if then:
                self.conn.send_packed_command(self.conn.pack_commands([args, *then]))
            else:
                self.conn.send_command(*args)
        except BaseException:
            self._release(broken=True)
            raise

    def _release(self, broken: bool = False) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            if broken:
                conn.disconnect()
            self.pool.release(conn)

    def ready(self) -> bool:
        """Whether the reply has arrived (reading it would not wait); a broken connection
        counts as ready, so that :meth:`result` raises."""
        if self.conn is None:
            return True
        try:
            return bool(self.conn.can_read(0))
        except _ERRORS:
            return True

    def close(self) -> None:
        """Give the connection back without reading the reply (it is dropped with the socket)."""
        self._release(broken=True)

    def result(self) -> Any:
        """The raw reply (waits for it)."""
        if self.conn is None:
            raise RuntimeError("the reply of this command was read already")
        try:
            reply = guarded(self.store.url, self.conn.read_response)
            self.then_replies = [guarded(self.store.url, self.conn.read_response)
                                 for _ in range(self.then)]
        except BaseException:
            self._release(broken=True)
            raise
        self._release()
        return reply


class SentWrite(SentCommand):
    """A write-script call sent on a connection of its own, its reply read later.

    Sources send a batch's write and decode the next batch while Redis runs it. Sending from the
    decoding thread itself matters: a writer thread had to win the GIL from the decoder before it
    could even send (Python's 5 ms switch interval), and Redis sat idle meanwhile (measured: the
    5-view drain took the sum of decode and Lua time instead of the larger of the two)."""

    def __init__(self, store: RedisStore, keys: list[str], args: list[Any]) -> None:
        self.keys, self.args = keys, args
        wait = store.wait
        super().__init__(store, "EVALSHA", store.writer.sha, len(keys), *keys, *args,
                         then=[("WAIT", wait[0], int(wait[1]))] if wait else ())

    def result(self) -> Any:
        """The script's reply; a lost script (Redis restarted) is loaded and the call made again
        — nothing ran, the reply was the NOSCRIPT error. With ``features.redis_wait_replicas``
        too few replicas acknowledging it raises ``StoreUnavailable`` (see ``redis_failover``)."""
        try:
            reply = super().result()
        except redis.exceptions.NoScriptError:
            guarded(self.store.url, lambda: self.store.client.script_load(WRITE_SCRIPT))
            return SentWrite(self.store, self.keys, self.args).result()
        if self.store.wait:
            check_replicas(self.then_replies[0], self.store.wait, self.store.url)
        return reply

    def counts(self) -> tuple[int, int, int]:
        """:meth:`result` of a stream write: (entries acked, events accepted, dead-lettered)."""
        res = self.result()
        return int(res[0]), int(res[1]), int(res[2])


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
        except _ERRORS:
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


def unpack_doubles(blob: bytes) -> tuple[float, ...]:
    return struct.unpack(f"<{len(blob) // 8}d", blob)
