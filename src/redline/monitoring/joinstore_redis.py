"""The label join in Redis: every worker and every replica on every host joins and reads the same.

Per model version, under one hash tag (one cluster slot), with a TTL refreshed on every write so
an abandoned version's keys go by themselves:

- ``pending`` (hash id -> score) and ``times`` (zset id -> wall time): predictions awaiting a
  label; at most ``capacity`` and none older than the TTL (the Lua ``EVICT`` moves the oldest out);
- ``gone`` (zset of ids, at most ``capacity``): ids that left unlabelled, so a late label is
  counted as late;
- ``done`` (zset of ids, at most ``capacity``): ids joined already, so a second label is a
  duplicate, not a second pair;
- ``pairs`` (list of ``"score label"``, capped at the window) and ``recent_f8`` (list of
  little-endian float64 blobs, one a written batch of scores, with their counts in ``recent_n``;
  the oldest trimmed while the rest still hold the window): what every process computes the
  same quality figures from. A blob, not an item a score: a ranker's 100 candidate scores a
  request made redis-py pack ~3,000 arguments a batch in Python, 10-20 ms of the GIL in one
  piece that every request arriving meanwhile waited out;
- ``counts`` (hash): evicted, joined, late.

Predictions are written by the monitoring tick in one pipeline per batch (``flush``); a join
is one Lua call per chunk of labels, atomic, so two workers never join one prediction twice.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
import uuid
from collections import deque
from typing import Any

import numpy as np

from redline.errors import StoreUnavailable
from redline.monitoring.handoff import yield_to_loop
from redline.monitoring.joinstore import JoinSnapshot

PREFIX = "redline:quality"
LABEL_CHUNK = 2000  # labels per Lua call: Redis serves nobody else while one runs
# Predictions with an id per pipeline (a ranker's request has one a candidate: 100): redis-py
# packs each argument in Python, ~0.6 µs, holding the GIL for the whole pipeline.
IDS_PER_PIPELINE = 256
PARSE_CHUNK = 500  # list items parsed to floats between two hand-overs (~0.3 ms)

EVICT = """
local p, t, g, c = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local cap, ttl, now = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n = 0
local old = redis.call('ZRANGEBYSCORE', t, '-inf', '(' .. ARGV[1])
for _, id in ipairs(old) do
  redis.call('HDEL', p, id); redis.call('ZADD', g, now, id); n = n + 1
end
if #old > 0 then redis.call('ZREMRANGEBYSCORE', t, '-inf', '(' .. ARGV[1]) end
local over = redis.call('ZCARD', t) - cap
if over > 0 then
  local popped = redis.call('ZPOPMIN', t, over)
  for i = 1, #popped, 2 do
    redis.call('HDEL', p, popped[i]); redis.call('ZADD', g, now, popped[i]); n = n + 1
  end
end
local gover = redis.call('ZCARD', g) - cap
if gover > 0 then redis.call('ZPOPMIN', g, gover) end
if n > 0 then redis.call('HINCRBY', c, 'evicted', n) end
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return n
"""

JOIN = """
local p, t, g, l, c, d = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local window, ttl, cap, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local out, joined = {}, 0
for i = 5, #ARGV, 2 do
  local id = ARGV[i]
  local s = redis.call('HGET', p, id)
  if s then
    redis.call('HDEL', p, id); redis.call('ZREM', t, id)
    redis.call('RPUSH', l, s .. ' ' .. ARGV[i + 1])
    redis.call('ZADD', d, now, id)
    joined = joined + 1; out[#out + 1] = 1
  elseif redis.call('ZSCORE', d, id) then
    out[#out + 1] = 3
  elseif redis.call('ZSCORE', g, id) then
    out[#out + 1] = 2
  else
    out[#out + 1] = 0
  end
end
if joined > 0 then
  redis.call('LTRIM', l, -window, -1)
  redis.call('HINCRBY', c, 'joined', joined)
  local over = redis.call('ZCARD', d) - cap
  if over > 0 then redis.call('ZPOPMIN', d, over) end
  redis.call('EXPIRE', l, ttl); redis.call('EXPIRE', c, ttl); redis.call('EXPIRE', d, ttl)
end
return out
"""

# A written batch's scores as one blob (``ARGV[1]``, ``ARGV[2]`` of them), then the oldest
# blobs dropped while the rest still hold ``ARGV[3]`` scores: the window, trimmed by count
# whatever the batches' sizes. Atomic, so the blob and count lists stay in step across workers.
PUSH_RECENT = """
local f, n = KEYS[1], KEYS[2]
local window = tonumber(ARGV[3])
redis.call('RPUSH', f, ARGV[1]); redis.call('RPUSH', n, ARGV[2])
local counts = redis.call('LRANGE', n, 0, -1)
local total = 0
for i = 1, #counts do total = total + tonumber(counts[i]) end
local drop = 0
while drop < #counts - 1 and total - tonumber(counts[drop + 1]) >= window do
  total = total - tonumber(counts[drop + 1]); drop = drop + 1
end
if drop > 0 then redis.call('LTRIM', f, drop, -1); redis.call('LTRIM', n, drop, -1) end
redis.call('EXPIRE', f, ARGV[4]); redis.call('EXPIRE', n, ARGV[4])
return drop
"""

LEASE = """
local owner = redis.call('GET', KEYS[1])
if not owner or owner == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""


class RedisJoin:
    """One version's join in Redis; predictions wait in a bounded local batch until ``flush``."""

    def __init__(self, backend: RedisBackend, model: str, version: str, capacity: int,
                 ttl_s: float, window: int) -> None:
        self.backend = backend
        tag = f"{PREFIX}:{{{model}:{version}}}"
        self.keys = {k: f"{tag}:{k}" for k in ("pending", "times", "gone", "pairs", "recent_f8",
                                               "recent_n", "counts", "done")}
        self.capacity, self.ttl = capacity, max(60, int(ttl_s))
        self.window = window
        self._batches: deque[tuple[int, float, list[str], list[float]]] = deque()
        self._seq = itertools.count()
        self._rows = 0
        self._dropped = 0  # predictions dropped from the local batches before they were written
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- predictions (the tick)
    def predicted(self, request_ids: list[str], scores: np.ndarray) -> None:
        values = scores.tolist()
        with self._lock:
            self._batches.append((next(self._seq), time.time(), list(request_ids), values))
            self._rows += len(values)
            # Bounded while it waits (Redis down): the oldest batches go, counted as evicted at
            # the next write.
            bound = 2 * self.capacity + self.window
            while self._rows > bound and len(self._batches) > 1:
                _, _, ids, dropped = self._batches.popleft()
                self._rows -= len(dropped)
                self._dropped += sum(1 for rid in ids if rid)

    def flush(self) -> None:
        """The waiting predictions into Redis, a pipeline per batch (an absorbed slice) or
        per ``IDS_PER_PIPELINE`` of its ids, with a hand-over to the loop between two (on the
        tick's thread): one pipeline for a tick's ~500 predictions was ~1.5 ms of the GIL
        packing and parsing in one piece, and kept Redis from the requests' feature reads
        meanwhile. A batch written is forgotten at once, so a failure part-way re-sends only
        what was not written."""
        with self._lock:
            batches, dropped = list(self._batches), self._dropped
        if not batches:
            return
        k = self.keys
        now = time.time()
        for n, (seq, t, ids, values) in enumerate(batches):
            kept = [(rid, s) for rid, s in zip(ids, values, strict=False) if rid]
            # The ids in pipelines of IDS_PER_PIPELINE, a hand-over between two; the scores and
            # the eviction with the last. A failure part-way re-sends the batch: writing an id
            # again is harmless, and the scores go only once it is all written.
            parts = [kept[i:i + IDS_PER_PIPELINE]
                     for i in range(0, len(kept), IDS_PER_PIPELINE)] or [[]]
            for i, part in enumerate(parts):
                if n or i:
                    yield_to_loop()
                pipe = self.backend.client.pipeline(transaction=False)
                self._pending(pipe, dict(part), t)
                if i < len(parts) - 1:
                    self.backend.guarded(pipe.execute)
            if values:
                recent = values[-self.window:]
                pipe.eval(PUSH_RECENT, 2, k["recent_f8"], k["recent_n"],
                          np.asarray(recent, dtype="<f8").tobytes(), len(recent), self.window,
                          self.ttl)
            if n == len(batches) - 1:
                if dropped:
                    pipe.hincrby(k["counts"], "evicted", dropped)
                evict: tuple[Any, ...] = (
                    k["pending"], k["times"], k["gone"], k["counts"], k["pairs"],
                    k["recent_f8"], k["recent_n"], k["done"], now - self.ttl, self.capacity,
                    self.ttl, now)
                pipe.evalsha(self.backend.evict.sha, 8, *evict)
            else:
                evict = ()
            self.backend.guarded(lambda pipe=pipe, evict=evict: self._execute(pipe, evict))
            with self._lock:  # written: forget them (new ones may have come meanwhile)
                while self._batches and self._batches[0][0] <= seq:
                    self._rows -= len(self._batches.popleft()[3])
        with self._lock:
            self._dropped -= dropped

    def _pending(self, pipe: Any, kept: dict[str, float], t: float) -> None:
        """Predictions with an id, waiting for their labels, into ``pipe``."""
        if kept:
            pipe.hset(self.keys["pending"], mapping=kept)
            pipe.zadd(self.keys["times"], dict.fromkeys(kept, t))

    def _execute(self, pipe: Any, evict: tuple[Any, ...]) -> None:
        """Run ``pipe``, whose last call (when ``evict`` is set) is the eviction script by
        EVALSHA: sent straight away, not after a ``SCRIPT EXISTS`` round trip each tick. A
        Redis that lost the script (restarted, flushed) answers NOSCRIPT; the script is then
        loaded and that one call made again (the writes before it went through)."""
        import redis

        replies = pipe.execute(raise_on_error=False)
        if evict and isinstance(replies[-1], redis.exceptions.NoScriptError):
            client = self.backend.client
            client.script_load(self.backend.evict.script)
            replies[-1] = client.evalsha(self.backend.evict.sha, 8, *evict)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    # ---------------------------------------------------------------- labels (the routes)
    def join(self, request_ids: list[str], labels: list[float]) -> list[int]:
        k = self.keys
        keys = [k["pending"], k["times"], k["gone"], k["pairs"], k["counts"], k["done"]]
        out: list[int] = []
        for start in range(0, len(request_ids), LABEL_CHUNK):
            args: list[Any] = [self.window, self.ttl, self.capacity, repr(time.time())]
            for rid, label in zip(request_ids[start:start + LABEL_CHUNK],
                                  labels[start:start + LABEL_CHUNK], strict=True):
                args += [rid, repr(float(label))]
            out += [int(o) for o in self.backend.guarded(
                lambda a=args: self.backend.join(keys=keys, args=a))]
        return out

    def count_late(self, n: int) -> None:
        self.backend.guarded(lambda: self.backend.client.hincrby(self.keys["counts"], "late", n))

    def label_score(self, score: float, label: float) -> None:
        k = self.keys
        pipe = self.backend.client.pipeline(transaction=False)
        pipe.rpush(k["pairs"], f"{float(score)!r} {float(label)!r}")
        pipe.ltrim(k["pairs"], -self.window, -1)
        pipe.hincrby(k["counts"], "joined", 1)
        pipe.expire(k["pairs"], self.ttl)
        self.backend.guarded(pipe.execute)

    def snapshot(self) -> JoinSnapshot:
        """The labelled pairs and recent scores, read in two round trips; the pairs parsed in
        chunks with a hand-over to the loop between them (on the tick's thread): 5,000 as one
        list were ~3 ms of float parsing in one piece. The scores are binary: no parsing."""
        k = self.keys
        pipe = self.backend.client.pipeline(transaction=False)
        pipe.lrange(k["pairs"], 0, -1)
        pipe.hlen(k["pending"])
        pipe.hmget(k["counts"], ["evicted", "joined", "late"])
        pairs, pending, counts = self.backend.guarded(pipe.execute)
        labelled = _floats(pairs).reshape(-1, 2)
        del pairs
        yield_to_loop()
        blobs = self.backend.guarded(lambda: self.backend.client.lrange(k["recent_f8"], 0, -1))
        recent = np.frombuffer(b"".join(blobs), dtype="<f8")[-self.window:].astype(np.float64)
        evicted, joined, late = (int(c or 0) for c in counts)
        return JoinSnapshot(labelled, recent, int(pending), evicted, joined, late)


class RedisBackend:
    """The Redis client and scripts every version's join shares."""

    kind = "redis"
    shared = True

    def __init__(self, url: str, cluster: bool = False, timeout_ms: float = 2000.0) -> None:
        from redline.features.online.redis_client import connect

        self.url = url
        self.client = connect(url, cluster=cluster, timeout_ms=timeout_ms)
        self.evict = self.client.register_script(EVICT)
        self.join = self.client.register_script(JOIN)
        self.lease = self.client.register_script(LEASE)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.states: list[RedisJoin] = []
        self._unmatched_key = f"{PREFIX}:unmatched"

    def state(self, model: str, version: str, capacity: int, ttl_s: float,
              window: int) -> RedisJoin:
        state = RedisJoin(self, model, version, capacity, ttl_s, window)
        self.states.append(state)
        return state

    def flush(self) -> None:
        """Every version's waiting predictions into Redis (the tick; a failure keeps them)."""
        for state in list(self.states):
            state.flush()

    def count_unmatched(self, model: str | None, n: int) -> None:
        self.guarded(lambda: self.client.hincrby(self._unmatched_key, model or "", n))

    def unmatched(self, model: str) -> int:
        got = self.guarded(lambda: self.client.hmget(self._unmatched_key, [model, ""]))
        return sum(int(v or 0) for v in got)

    def leads(self, name: str, ttl_s: float) -> bool:
        """Whether this process holds (or now takes) the lease ``name``; with Redis down, yes:
        an alert sent twice beats one not sent."""
        try:
            return bool(self.guarded(lambda: self.lease(
                keys=[f"{PREFIX}:lease:{name}"], args=[self.owner, int(ttl_s * 1000)])))
        except StoreUnavailable:
            return True

    def guarded(self, fn: Any) -> Any:
        import redis

        try:
            return fn()
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(
                f"the label join's Redis at {self.url} cannot be reached ({type(exc).__name__}: "
                f"{exc}); labels and quality figures are refused until it is back (predictions "
                "wait in memory, bounded); post the labels again then") from exc


def _floats(items: list[bytes]) -> np.ndarray:
    """The numbers in ``items`` (each one or more, space-separated), parsed a chunk at a time
    with a hand-over to the loop between chunks (on the tick's thread)."""
    if not items:
        return np.empty(0, dtype=np.float64)
    parts = []
    for start in range(0, len(items), PARSE_CHUNK):
        if start:
            yield_to_loop()
        parts.append(np.array(b" ".join(items[start:start + PARSE_CHUNK]).split(),
                              dtype=np.float64))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
