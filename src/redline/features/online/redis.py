"""The Redis online store: tiles in one hash per (entity, view version), merged by Lua in Redis.

One read of any number of views for a batch of entities is one EVALSHA — one round trip. Writes
of a batch are one EVALSHA too, atomic: with a stream, the same script checks the entries are
still pending for this consumer, applies their tile updates, acks them and dead-letters the bad
ones, so a consumer killed at any instant neither loses nor double-counts an event.

Against Redis Cluster (``features.redis_cluster: true``) every key of one entity shares the hash
tag ``{entity:id}``, so one entity's read is still one round trip to one shard; a batch is one
call per shard it touches.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, TypeVar

import numpy as np
import redis
import redis.cluster
from redis.commands.core import Script

from redline.errors import StoreUnavailable
from redline.features.definitions import FeatureView
from redline.features.events import UpdateBatch
from redline.features.online.base import EntityIds, ReadPlan, now_ms
from redline.features.online.redis_lua import WRITE_SCRIPT, read_script

T = TypeVar("T")
_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.cluster.ClusterDownError,
           redis.exceptions.ClusterError, OSError)


def connect(url: str, *, cluster: bool = False, timeout_ms: float = 50.0) -> Any:
    """A redis-py client (or cluster client) for ``url``; the factory sessions reuse too."""
    timeout = timeout_ms / 1000.0
    kw = dict(socket_timeout=timeout, socket_connect_timeout=max(timeout, 0.5))
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


class RedisReader:
    def __init__(self, store: RedisStore, plan: ReadPlan, cache: bool = True) -> None:
        self.store = store
        self.plan = plan
        self.script: Script = store.client.register_script(read_script(plan.views, cache))
        self.view_windows = [[w.window for w in v.layout().windows] for v in plan.views]
        try:  # load now so the first read is one round trip (NOSCRIPT is retried if Redis restarts)
            if not store.cluster:
                store.client.script_load(self.script.script)
        except _ERRORS:
            pass  # Redis is down now: the first read raises StoreUnavailable
        self.windows = [w.window for v in plan.views for w in v.layout().windows]
        self.row_width = 1 + plan.width

    def _args(self, now: int) -> list[Any]:
        args: list[Any] = [
            "|".join(str(w.covering(now)[1]) for w in ws) + "#" for ws in self.view_windows]
        for w in self.windows:
            lo, hi = w.covering(now)
            args.append(lo)
            args.append(hi)
        return args

    def read(self, ids: EntityIds, now: int | None = None, dtype: type = np.float32
             ) -> tuple[np.ndarray, np.ndarray]:
        now = now_ms() if now is None else now
        n, data_keys = self.plan.keys(ids)
        nv = len(self.plan.views)
        keys = []
        for r in range(n):
            row = data_keys[r * nv:(r + 1) * nv]
            keys += row
            keys += [cache_key(k) for k in row]
        args = self._args(now)
        if not self.store.cluster:
            replies = guarded(self.store.url, lambda: self.script(keys=keys, args=args))
        else:
            replies = guarded(self.store.url, lambda: self._cluster_read(n, keys, args))
        flat = np.frombuffer(b"".join(replies), dtype="<f8").reshape(n, self.row_width)
        return flat[:, 1:][:, self.plan.take].astype(dtype), flat[:, 0] == 0

    def _cluster_read(self, n: int, keys: list[str], args: list[Any]) -> list[bytes]:
        nv = 2 * len(self.plan.views)
        client = self.store.client
        by_slot: dict[int, list[int]] = {}
        for r in range(n):
            by_slot.setdefault(client.keyslot(keys[r * nv]), []).append(r)
        replies: list[bytes] = [b""] * n
        for rows in by_slot.values():
            group = [keys[r * nv + j] for r in rows for j in range(nv)]
            for r, rep in zip(rows, self.script(keys=group, args=args), strict=True):
                replies[r] = rep
        return replies


def write_args(batch: UpdateBatch) -> list[Any]:
    """ARGV tail shared by plain and stream writes: accepted tags, dead letters, TTLs, ops —
    numbers as packed little-endian doubles (see ``redis_lua.WRITE_SCRIPT``)."""
    args: list[Any] = [array("d", batch.accepted).tobytes(), len(batch.rejected)]
    for r in batch.rejected:
        args += [r.tag, r.reason.split(":", 1)[0].split(" ", 1)[0], r.reason, r.raw]
    args.append(array("d", batch.key_ttl_ms).tobytes())
    args.append(array("d", chain.from_iterable(batch.ops)).tobytes())
    return args


class RedisStore:
    """Online store in Redis (single server or cluster)."""

    kind = "redis"

    def __init__(self, url: str, *, cluster: bool = False, timeout_ms: float = 50.0) -> None:
        self.url = url
        self.cluster = cluster
        self.client = connect(url, cluster=cluster, timeout_ms=timeout_ms)
        self.writer = self.client.register_script(WRITE_SCRIPT)

    def reader(self, views: Sequence[FeatureView], features: Sequence[str] | None = None,
               cache: bool = True) -> RedisReader:
        """A compiled reader; ``cache=False`` merges every tile on every read (benchmarks)."""
        return RedisReader(self, ReadPlan(views, features), cache)

    def write(self, batch: UpdateBatch) -> None:
        """Apply a batch's tile updates atomically (per shard in a cluster)."""
        if not batch.ops:
            return
        if not self.cluster:
            args = ["0", *write_args(batch)]
            keys = [*batch.keys, *map(cache_key, batch.keys)]
            guarded(self.url, lambda: self.writer(keys=keys, args=args))
            return
        guarded(self.url, lambda: self._cluster_write(batch))

    def _cluster_write(self, batch: UpdateBatch) -> None:
        by_slot: dict[int, list[int]] = {}
        for i, key in enumerate(batch.keys):
            by_slot.setdefault(self.client.keyslot(key), []).append(i)
        for idxs in by_slot.values():
            sub = UpdateBatch()
            remap = {}
            for i in idxs:
                remap[i] = sub.key(batch.keys[i], batch.key_ttl_ms[i])
            sub.ops = [(remap[op[0]], *op[1:]) for op in batch.ops if op[0] in remap]  # type: ignore[misc]
            self.writer(keys=[*sub.keys, *map(cache_key, sub.keys)],
                        args=["0", *write_args(sub)])

    def write_from_stream(self, stream: str, group: str, consumer: str, ids: Sequence[bytes | str],
                          batch: UpdateBatch) -> tuple[int, int, int]:
        """Exactly-once apply of stream entries ``ids`` (in id order; tags index into them): returns
        (entries acked, events accepted, events dead-lettered) — zeros for entries another
        consumer already claimed."""
        keys = [stream, f"{stream}:dead", f"{stream}:stats", *batch.keys,
                *map(cache_key, batch.keys)]
        args = ["1", group, consumer, len(ids), ids[0], ids[-1], *ids, *write_args(batch)]
        res = guarded(self.url, lambda: self.writer(keys=keys, args=args))
        return int(res[0]), int(res[1]), int(res[2])

    def ping(self) -> None:
        guarded(self.url, self.client.ping)

    def close(self) -> None:
        self.client.close()


def unpack_doubles(blob: bytes) -> tuple[float, ...]:
    return struct.unpack(f"<{len(blob) // 8}d", blob)
