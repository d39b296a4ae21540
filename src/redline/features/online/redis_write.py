"""The write script's KEYS and ARGV for a batch of tile updates: the hashes it touches, the
updates packed compactly, and the heads of its modes (plain, stream, partitioned log, sharded
log with decimal positions). Pure packing; sending is the store's."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from redline.features.online.redis_failover import batch_tops, tops_blob
from redline.features.updates import UpdateBatch


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
