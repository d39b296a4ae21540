"""Redis Streams source: one member of a consumer group applying each entry exactly once.

Each batch is applied by one Lua call that also checks the entries are still pending for this
consumer and acks them (``RedisStore.write_from_stream``), and entries of dead consumers are taken
over with XAUTOCLAIM, so SIGKILL at any instant loses and repeats nothing.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redline.features.definitions import FeatureDefinitions
from redline.features.events import EventDecoder
from redline.features.ingest.core import Freshness, IngestCounts, hand_off_sessions
from redline.features.sessions import SessionSink
from redline.features.updates import UpdateBatch


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """A raw XREADGROUP reply of one stream (RESP2: ``[[stream, [[id, [k, v, ...]], ...]]]``,
    nil when empty) as ``[(id, {k: v})]``, without entries deleted meanwhile."""
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3: a map stream -> entries
        reply = list(reply.items())
    out = []
    for entry_id, fields in reply[0][1]:
        if fields:
            out.append((entry_id, dict(zip(fields[::2], fields[1::2], strict=True))))
    return out


def _stream_ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


class StreamConsumer:
    """One consumer of a Redis Streams consumer group applying events exactly once."""

    source_kind = "redis-stream"  # the ingest metrics' ``source`` label

    def __init__(self, defs: FeatureDefinitions, store: Any, *, stream: str, group: str,
                 consumer: str | None = None, batch: int = 1000, claim_idle_ms: int = 30000,
                 block_ms: int = 100, source: str | None = None,
                 sessions: SessionSink | None = None) -> None:
        self.store = store
        self.sessions = sessions  # where session item events go (none: dead letters)
        self.client = store.client
        self.stream = stream
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.batch = batch
        self.claim_idle_ms = claim_idle_ms
        self.block_ms = block_ms
        self.decoder = EventDecoder(defs, source)
        self.counts = IngestCounts()
        self.freshness = Freshness()
        self.claimed = 0
        self._last_claim = 0.0
        self._recovered = False
        # the write in flight: call it to wait for it; returns its entries applied
        self._inflight: Callable[[], int] | None = None
        # entries read ahead (delivered to us, pending, not yet decoded)
        self._ahead: list[tuple[bytes, dict[bytes, bytes]]] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="redline-ingest-write")
        # on a cluster: how long a key remembers the entry ids it applied (an entry must be acked
        # or claimed within it to count once)
        self.dedup_window_ms = max(600_000, 20 * claim_idle_ms)
        self.ensure_group()

    def ensure_group(self) -> None:
        import redis

        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _decode(self, entries: list[tuple[bytes, dict[bytes, bytes]]]
                ) -> tuple[list[bytes], UpdateBatch]:
        ids = [e[0] for e in entries]
        arrivals = [_stream_ms(i) for i in ids]  # arrival = the entry's id: replays agree
        batch = self.decoder.decode([e[1] for e in entries], arrivals)
        hand_off_sessions(batch, self.sessions)  # before the write that acks their entries
        return ids, batch

    def _write(self, ids: list[bytes], batch: UpdateBatch) -> int:
        if self.store.cluster:
            return self._write_cluster(ids, batch)
        return self._count(batch, self.store.write_from_stream(
            self.stream, self.group, self.consumer, ids, batch))

    def _prepare(self, ids: list[bytes], batch: UpdateBatch
                 ) -> Callable[[], Callable[[], int]]:
        """What starts a batch's write (and returns what waits for it). On one Redis the script
        call is built now, while Redis still runs the write in flight, sent from this thread when
        started, and its reply read when waited for (``redis.SentWrite``); on a cluster (several
        calls, then XACK) the write runs on the writer thread."""
        if self.store.cluster:
            return lambda: self._pool.submit(self._write_cluster, ids, batch).result
        from redline.features.online.redis_write import stream_call

        keys, args = stream_call(self.stream, self.group, self.consumer, ids, batch)

        def start() -> Callable[[], int]:
            sent = self.store.send(keys, args)
            return lambda: self._count(batch, sent.counts())
        return start

    def _count(self, batch: UpdateBatch, res: tuple[int, int, int]) -> int:
        acked, accepted, dead = res
        if acked:  # freshness: when the reply was read, at most one decode after Redis applied it
            self.freshness.record(batch.event_ts, time.time_ns())
            self.counts.accepted += accepted
            self.counts.dead += dead
        return int(acked)

    def _write_cluster(self, ids: list[bytes], batch: UpdateBatch) -> int:
        """On a cluster the stream and the tiles are on different shards, so the apply and the
        XACK cannot be one script: the tiles are written first, each key skipping entry ids it
        already applied (``RedisStore.write_stream_entries``), then the entries are acked. A
        crash between the two re-delivers entries that the keys then skip. Dead letters and the
        stats counters are written after the tiles and may repeat after such a crash."""
        self.store.write_stream_entries(ids, batch, self.dedup_window_ms)
        pipe = self.client.pipeline(transaction=False)
        for r in batch.rejected:
            pipe.xadd(f"{self.stream}:dead", {"reason": r.reason, "event": r.raw,
                                              "id": ids[r.tag]}, maxlen=100000, approximate=True)
        stats = f"{self.stream}:stats"
        if batch.accepted:
            pipe.hincrby(stats, "accepted", len(batch.accepted))
        if batch.rejected:
            pipe.hincrby(stats, "dead", len(batch.rejected))
            for r in batch.rejected:
                pipe.hincrby(stats, "dead:" + r.reason.split(":", 1)[0].split(" ", 1)[0], 1)
        pipe.execute()
        self.client.xack(self.stream, self.group, *ids)
        self.freshness.record(batch.event_ts, time.time_ns())
        self.counts.accepted += len(batch.accepted)
        self.counts.dead += len(batch.rejected)
        return len(ids)

    def _apply(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> int:
        """Decode and apply synchronously; returns entries applied (0 if claimed by another)."""
        if not entries:
            return 0
        return self._write(*self._decode(entries))

    def flush(self) -> int:
        """Wait for the batch in flight; returns its applied count."""
        wait, self._inflight = self._inflight, None
        return wait() if wait is not None else 0

    def claim(self) -> int:
        """Take over entries idle longer than ``claim_idle_ms`` (their consumer died) and apply."""
        total = 0
        start = "0-0"
        while True:
            res = self.client.xautoclaim(self.stream, self.group, self.consumer,
                                         self.claim_idle_ms, start_id=start, count=self.batch)
            start, entries = res[0], [e for e in res[1] if e[1] is not None]
            total += self._apply(entries)
            if start in (b"0-0", "0-0") or not res[1]:
                break
        self.claimed += total
        return total

    def consumer_lag(self) -> list[tuple[str, str, int]]:
        """[(stream, partition, entries not yet delivered to the group)] from XINFO GROUPS
        (Redis 7: the group's ``lag``, else stream length minus ``entries-read``). One round trip;
        called at most once a second by the metrics wrapper, never per event."""
        for g in self.client.xinfo_groups(self.stream):
            name = g.get("name")
            if (name.decode() if isinstance(name, bytes) else name) != self.group:
                continue
            lag = g.get("lag")
            if lag is None and g.get("entries-read") is not None:
                lag = self.client.xlen(self.stream) - int(g["entries-read"])
            return [] if lag is None else [(self.stream, "-", int(lag))]
        return []

    def behind_latest(self) -> list[tuple[str, str, int]]:
        """None: a Redis Stream has no shards to be behind in (its lag is ``consumer_lag``)."""
        return []

    @property
    def source_name(self) -> str:
        """What the ingest metrics name this source by: its stream."""
        return self.stream

    def poll(self) -> int:
        """:meth:`step`, with a lost Redis connection raised as ``StoreUnavailable``; the
        consumer stays usable: call :meth:`reset` and poll again once Redis is back."""
        from redline.features.online.redis_client import guarded

        return guarded(self.store.url, self.step)

    def reset(self) -> None:
        """After an outage: forget the write in flight (its outcome is in Redis: applied and
        acked, or still pending and re-read), re-create the group if Redis came back empty."""
        wait, self._inflight = self._inflight, None
        if wait is not None:
            try:
                wait()
            except Exception:  # noqa: BLE001 - the outage itself; the entries stay pending
                pass
        self._recovered = False
        self._ahead = None  # read ahead, not applied: pending, re-read with our own entries
        self.ensure_group()

    def step(self) -> int:
        """One step: claim if due, then read new entries (blocking up to ``block_ms``).

        The next batch is decoded while the previous one runs in Redis (one write in flight, on
        its own connection), and the one after it is already read; each write is atomic and
        checks ownership, and entries read ahead stay pending for this consumer (re-read after
        a restart, claimed after a crash), so the overlap changes nothing about exactly-once.
        Returns entries applied in this step.
        """
        done = 0
        if not self._recovered:  # our own pending entries (a restart under the same name)
            done += self.flush()
            while True:
                resp = self.client.xreadgroup(self.group, self.consumer, {self.stream: "0"},
                                              count=self.batch)
                entries = [e for e in (resp[0][1] if resp else []) if e[1]]
                if not entries:
                    break
                done += self._apply(entries)
            self._recovered = True
        if time.monotonic() - self._last_claim > self.claim_idle_ms / 2000.0:
            self._last_claim = time.monotonic()
            done += self.flush()
            done += self.claim()
        ahead, self._ahead = self._ahead, None
        fresh = self._read(self.block_ms) if ahead is None else ahead
        if not fresh:
            return done + self.flush()
        ids, batch = self._decode(fresh)  # while the write in flight runs in Redis
        start = self._prepare(ids, batch)
        ahead_read = None
        if self._inflight is not None and not self.store.cluster:
            # ask for the next batch now: Redis answers it right after the write in flight and
            # before the write started below, whose run then covers parsing and decoding it, so
            # Redis never waits for the decoder (without the read-ahead the read queued behind
            # the write and Redis sat idle during each decode; parsed before the next write was
            # sent, Redis sat idle during the parse)
            from redline.features.online.redis_sent import SentCommand

            ahead_read = SentCommand(self.store, "XREADGROUP", "GROUP", self.group,
                                     self.consumer, "COUNT", self.batch, "STREAMS",
                                     self.stream, ">")
        elif self._inflight is not None:
            self._ahead = self._read(None)
        try:
            done += self.flush()
            self._inflight = start()
        except BaseException:
            if ahead_read is not None:  # an outage: its entries stay pending, re-read later
                ahead_read.close()
            raise
        if ahead_read is not None:
            self._ahead = _entries(ahead_read.result())
        return done

    def _read(self, block: int | None) -> list[tuple[bytes, dict[bytes, bytes]]]:
        resp = self.client.xreadgroup(self.group, self.consumer, {self.stream: ">"},
                                      count=self.batch, block=block)
        return [e for e in (resp[0][1] if resp else []) if e[1]]

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)

    def stats(self) -> dict[str, Any]:
        remote = {k.decode(): int(v) for k, v in
                  self.client.hgetall(f"{self.stream}:stats").items()}
        return {"consumer": self.consumer, "accepted": self.counts.accepted,
                "dead": self.counts.dead, "claimed": self.claimed, "stream_totals": remote,
                "freshness": self.freshness.summary()}
