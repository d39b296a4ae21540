"""Reading tiles from Redis: a compiled :class:`RedisReader` per set of views, one EVALSHA a
batch of entities on one Redis, and on a Cluster one script call per (entity type, slot),
pipelined per shard, shards in parallel, the replies joined back to rows by key."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import redis
from redis.commands.core import Script

from redline.errors import StoreUnavailable
from redline.features.definitions import FeatureView
from redline.features.online.base import EntityIds, ReadPlan, now_ms
from redline.features.online.redis_client import CONNECTION_ERRORS, guarded
from redline.features.online.redis_failover import SlotMapRefresh
from redline.features.online.redis_lua import read_script, source_groups
from redline.features.updates import store_key


class ReaderStore(Protocol):
    """What a reader needs of its store (:class:`~redline.features.online.redis.RedisStore`)."""

    url: str
    cluster: bool
    client: Any  # a redis-py client or cluster client
    slot_map: SlotMapRefresh | None


def key_parts(views: Sequence[FeatureView]) -> list[tuple[int, str, str]]:
    """Per hash of :func:`redis_lua.source_groups`: a view whose ids name it, and the key
    around the id."""
    out = []
    for group in source_groups(views):
        v = views[group[0]]
        head, _, tail = store_key(v.entity.name, "\0", v.source.name).partition("\0")
        out.append((group[0], head, tail))
    return out


def row_keys(parts: list[tuple[int, str, str]], cols: Sequence[Sequence[str]],
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
    """A compiled read of some views: one script, and its arguments kept until a tile boundary
    changes them."""

    def __init__(self, store: ReaderStore, plan: ReadPlan, cache: bool = True) -> None:
        self.store = store
        self.plan = plan
        self.cache = cache
        self.parts = key_parts(plan.views)
        self.script: Script = store.client.register_script(read_script(plan.views, cache))
        self.view_windows = [[w.window for w in v.layout().windows] for v in plan.views]
        try:  # load now so the first read is one round trip (NOSCRIPT is retried if Redis restarts)
            if not store.cluster:
                store.client.script_load(self.script.script)
        except CONNECTION_ERRORS:
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
        return n, row_keys(self.parts, cols, range(n), self.cache), self._args(now)

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
            sub = key_parts([plan.views[j] for j in g])
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
            calls = [(self.scripts[gi], row_keys(self.parts[gi], cols, rows, self.cache),
                      args[gi]) for gi, _slot, rows in todo]
            replies = evalsha_pipeline(node.redis_connection, calls)
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
                keys=row_keys(self.parts[gi], cols, rows, self.cache), args=args[gi]))
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


def evalsha_pipeline(conn: redis.Redis, calls: Sequence[tuple[Script, list[str], list[Any]]]
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
