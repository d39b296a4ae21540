"""Kafka source: one member of a consumer group, exactly-once effect on Redis and Redis Cluster.

Exactly once, step by step (docs/features-reference.md has the full argument):

1. A batch of messages is decoded by the shared decoder; each event keeps its (partition,
   offset).
2. ``RedisStore.write_positioned`` applies the tile updates and, *in the same Lua call*, records
   per key and partition the highest offset applied to that key. An update at or below that mark
   is skipped. On a cluster each call covers one slot (one entity's keys), so it stays atomic.
3. Only then are the offsets committed to Kafka (asynchronously; synchronously when partitions
   are revoked). A crash before the commit replays the batch, and step 2 skips what was applied.
4. The same script raises the group's *position* per partition in the store (on a cluster, per
   primary after its scripts returned; ``online.redis_failover``). A partition starts from the
   lower of the committed offset and that position + 1 — when it is assigned, and after every
   store outage — so a Redis failover that dropped writes the old primary had acknowledged
   (asynchronous replication) replays them instead of losing them.

Messages are partitioned by entity key (the producer's message key), so one partition holds an
entity's events in order; the marks are per partition, so other producers' keying still works.
Arrival time is the message timestamp (CreateTime or LogAppendTime), so a replay is admitted
exactly as the first delivery was.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from redline.errors import ConfigError
from redline.features.definitions import FeatureDefinitions
from redline.features.events import EventDecoder
from redline.features.ingest.core import Freshness, IngestCounts, hand_off_sessions
from redline.features.online.base import OnlineStore, now_ms
from redline.features.online.redis import RedisStore
from redline.features.online.redis_failover import position_key, start_offsets
from redline.features.sessions import SessionSink
from redline.features.updates import UpdateBatch

log = logging.getLogger("redline.ingest")


def _consumer_class() -> Any:
    try:
        from confluent_kafka import Consumer
    except ImportError as exc:
        raise ConfigError("Kafka ingest needs the Kafka client: pip install 'redline[kafka]'"
                          ) from exc
    return Consumer


def dead_letter_key(topic: str) -> str:
    """Hash of dead letters of ``topic``: field ``partition:offset`` → reason and raw event.
    Written by position, so a replayed batch writes the same fields again (no duplicates)."""
    return f"redline:dead:{topic}"


class KafkaSource:
    """Consumes ``topic`` in consumer group ``group`` into a Redis store (single or cluster)."""

    source_kind = "kafka"  # the ingest metrics' ``source`` label

    def __init__(self, defs: FeatureDefinitions, store: OnlineStore, *, topic: str,
                 bootstrap: str, group: str, batch: int = 1000, block_ms: int = 100,
                 config: Mapping[str, Any] | None = None, source: str | None = None,
                 client_id: str | None = None, commit_every_ms: int = 100,
                 sessions: SessionSink | None = None) -> None:
        if not isinstance(store, RedisStore):
            raise ConfigError("Kafka ingest writes to a shared store: set features.store: redis")
        self.store = store
        self.sessions = sessions  # where session item events go (none: dead letters)
        self.topic = topic
        self.group = group
        self.batch = batch
        self.block_s = block_ms / 1000.0
        self.decoder = EventDecoder(defs, source)
        self.counts = IngestCounts()
        self.freshness = Freshness()
        self.name = client_id or f"{socket.gethostname()}-{os.getpid()}"
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap, "group.id": group, "client.id": self.name,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # the broker answers a fetch once data is there or after this wait; librdkafka's
            # 500 ms default would be the freshness of an event on a quiet topic
            "fetch.wait.max.ms": 10,
        }
        conf.update(config or {})
        self.consumer = _consumer_class()(conf)
        self._cooperative = "cooperative" in str(conf.get("partition.assignment.strategy", ""))
        # partitions must be placed from the store's positions before anything is applied (a
        # rebalance assigned them while the store could not be read, or the store was down)
        self._rewind = False
        self.replayed = 0  # messages read again because the store was behind (a failover)
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        # the write in flight: call it to wait for it
        self._inflight: Callable[[], tuple[int, dict[int, int]]] | None = None
        self._ready: Callable[[], bool] | None = None  # whether its reply is there
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="redline-kafka-write")
        self.errors = 0
        # per partition: the offset after the last message applied (and committed) by this
        # process; the consumer lag is measured from it
        self.applied: dict[int, int] = {}
        self._lag_reported: set[int] = set()
        # offsets applied but not yet committed to Kafka: committed at most every
        # ``commit_every_ms`` (a commit per small batch loaded the broker), synchronously on a
        # revoke and on close; a crash replays at most that much, and the marks skip it
        self._to_commit: dict[int, int] = {}
        self._commit_every_s = commit_every_ms / 1000.0
        self._next_commit = 0.0

    # -- the Source interface -----------------------------------------------------------------

    def poll(self) -> int:
        """Read a batch, decode it, start its write (the previous one finishes first)."""
        if self._rewind and not self._rewind_now():  # a store still down raises
            time.sleep(self.block_s)  # the broker is not ready for it yet: again next poll
            return 0
        # what the client holds already, up to a batch, without waiting: batches are as large as
        # the backlog (small when caught up, so nothing waits for a batch to fill)
        msgs = self.consumer.consume(self.batch, 0)
        if self._rewind:  # a rebalance inside consume() could not place its partitions
            return 0  # what came is read again after the rewind
        if not msgs:
            # caught up: finish the write in flight first (its events become visible and its
            # offsets are committed now, not after the next message), then wait for one message
            # and take what came with it
            done = self.flush()
            msgs = self.consumer.consume(1, self.block_s)
            if not msgs or self._rewind:
                return done
            if self.batch > 1:
                msgs += self.consumer.consume(self.batch - 1, 0)
            return done + self._start(msgs)
        return self._start(msgs)

    def _start(self, msgs: list[Any]) -> int:
        """Decode ``msgs``, start their write once the write in flight is done."""
        good = []
        for m in msgs:
            if m.error() is None:
                good.append(m)
            else:  # broker/transport notices; librdkafka retries on its own
                self.errors += 1
        if not good:
            return self.flush()
        done = 0
        if self._ready is not None and self._ready():
            # the write in flight is applied already: count it (and its freshness) now, not
            # after this batch's decode
            done = self.flush()
        positions = [(m.partition(), m.offset()) for m in good]
        arrivals = []
        for m in good:
            kind, ts = m.timestamp()
            arrivals.append(ts if kind and ts >= 0 else now_ms())
        batch = self.decoder.decode([m.value() for m in good], arrivals)
        hand_off_sessions(batch, self.sessions)  # before the write their offsets follow
        start = self._prepare(positions, batch)
        done += self.flush()
        self._inflight = start()
        return done

    def flush(self) -> int:
        """Wait for the write in flight, then commit its offsets (after the tiles, never before)."""
        wait, self._inflight = self._inflight, None
        self._ready = None
        if wait is None:
            return 0
        n, offsets = wait()
        self.applied.update(offsets)
        self._to_commit.update(offsets)
        now = time.monotonic()
        if now >= self._next_commit:
            self._next_commit = now + self._commit_every_s
            self._commit_pending(asynchronous=True)
        return n

    def _commit_pending(self, asynchronous: bool) -> None:
        offsets, self._to_commit = self._to_commit, {}
        self._commit(offsets, asynchronous=asynchronous)

    def reset(self) -> None:
        """After a store outage: the batch in flight was applied or not (its offsets are not
        committed either way); rewind every assigned partition to the lower of its committed
        offset and the store's position + 1 (a failover may have dropped acknowledged writes).
        Nothing is applied before that rewind has been made (:meth:`poll` makes it first)."""
        wait, self._inflight = self._inflight, None
        self._ready = None
        if wait is not None:
            try:
                wait()
            except Exception:  # noqa: BLE001 - the outage itself
                pass
        self._rewind = True
        self._rewind_now()

    def _starts(self, partitions: Sequence[int]) -> dict[int, int]:
        """Where each of ``partitions`` starts (``redis_failover.start_offsets``); a partition
        where the store is behind the committed offset is logged and counted."""
        from confluent_kafka import TopicPartition

        committed = {tp.partition: tp.offset for tp in self.consumer.committed(
            [TopicPartition(self.topic, p) for p in partitions], timeout=10)}
        stored = self.store.source_positions(self.topic, self.group)
        starts, behind = start_offsets(committed, stored, partitions)
        for part, n in sorted(behind.items()):
            self.replayed += n
            log.warning("ingest: the store's position in %s partition %d is %d behind the "
                        "group's committed offset %d (a Redis failover dropped writes the old "
                        "primary had acknowledged): reading them again", self.topic, part, n,
                        committed[part])
        return starts

    def _rewind_now(self) -> bool:
        """Seek every assigned partition to where :meth:`_starts` says; False when the broker
        could not tell the committed offsets or take the seek yet. Raises ``StoreUnavailable``
        while the store cannot be read. Either way the rewind stays due until it is made."""
        from confluent_kafka import KafkaException, TopicPartition

        assigned = self.consumer.assignment()
        if assigned:
            try:
                starts = self._starts([tp.partition for tp in assigned])
                for tp in assigned:
                    offset = starts.get(tp.partition, 0)  # none committed or stored: the start
                    self.consumer.seek(TopicPartition(self.topic, tp.partition, offset))
            except KafkaException:
                return False
        self._rewind = False
        return True

    def _on_assign(self, consumer: Any, partitions: Any) -> None:
        """Place newly assigned partitions where :meth:`_starts` says; when the store cannot
        be read now, assign them as they are and let :meth:`poll` rewind before it applies."""
        try:
            starts = self._starts([tp.partition for tp in partitions])
            for tp in partitions:
                if tp.partition in starts:
                    tp.offset = starts[tp.partition]
        except Exception:  # noqa: BLE001 - the store (or broker) is down: rewind later
            self._rewind = True
        if self._cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)

    @property
    def source_name(self) -> str:
        """What the ingest metrics name this source by: its topic."""
        return self.topic

    def behind_latest(self) -> list[tuple[str, str, int]]:
        """None: Kafka's measure is ``consumer_lag`` (messages), not time behind the tip."""
        return []

    def consumer_lag(self, timeout_s: float = 1.0) -> list[tuple[str, str, int]]:
        """[(topic, partition, messages not yet applied)] for the partitions this member owns.

        Measured: the end of the partition minus the offset after the last message this process
        applied (the offset it commits). The end is the broker's high watermark (a ListOffsets
        request to the leader, not the cached fetch value), or the consumer's position (the
        offset after the last message fetched) when that is further: tansu, the broker the tests
        use, answers the base offset of the partition's last record batch + 1, which is short
        by the rest of that batch. A partition this process has applied nothing from is
        measured from the group's committed offset, or the low watermark when none is
        committed. Partitions it reported before and no longer owns are reported as 0 (their
        new owner reports them; the gauge keeps the maximum of live processes). One request
        per owned partition, sampled at most once a second by the metrics wrapper."""
        assigned = self.consumer.assignment()
        owned = {tp.partition for tp in assigned}
        committed: dict[int, int] | None = None
        fetched = {tp.partition: tp.offset for tp in self.consumer.position(assigned)}
        out = []
        for tp in sorted(assigned, key=lambda t: t.partition):
            low, high = self.consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
            end = max(high, fetched.get(tp.partition, -1))
            pos = self.applied.get(tp.partition)
            if pos is None:
                if committed is None:
                    committed = {c.partition: c.offset for c in
                                 self.consumer.committed(list(assigned), timeout=timeout_s)}
                got = committed.get(tp.partition, -1)
                pos = got if got >= 0 else low
            out.append((self.topic, str(tp.partition), max(0, end - pos)))
        out += [(self.topic, str(p), 0) for p in sorted(self._lag_reported - owned)]
        self._lag_reported |= owned
        return out

    def stats(self) -> dict[str, Any]:
        return {"consumer": self.name, "topic": self.topic, "group": self.group,
                "partitions": self._owned(),
                "accepted": self.counts.accepted, "dead": self.counts.dead,
                "dead_by_reason": dict(self.counts.by_reason), "errors": self.errors,
                "replayed": self.replayed, "freshness": self.freshness.summary()}

    def _owned(self) -> list[int]:
        """The partitions the group gives this member now (none while it rebalances)."""
        try:
            return sorted(tp.partition for tp in self.consumer.assignment())
        except RuntimeError:  # closed
            return []

    def close(self) -> None:
        try:
            self.flush()
            self._commit_pending(asynchronous=False)
        finally:
            self._pool.shutdown(wait=True)
            self.consumer.close()

    # -- internals -----------------------------------------------------------------------------

    def _prepare(self, positions: Sequence[tuple[int, int]], batch: UpdateBatch
                 ) -> Callable[[], Callable[[], tuple[int, dict[int, int]]]]:
        """What starts a batch's write (and returns what waits for it). On one Redis the script
        call is built now and sent from this thread when started, its reply read when waited
        for (``redis.SentWrite``: no GIL hand-off to a writer thread before Redis can start);
        on a cluster the write runs on the writer thread."""
        if self.store.cluster:
            def start_cluster() -> Callable[[], tuple[int, dict[int, int]]]:
                fut = self._pool.submit(self._write, positions, batch)
                self._ready = fut.done
                return fut.result
            return start_cluster
        from redline.features.online.redis_write import positioned_call

        keys, args = positioned_call(self.topic, positions, batch,
                                     position_key(self.topic, self.group))

        def start() -> Callable[[], tuple[int, dict[int, int]]]:
            sent = self.store.send(keys, args)
            self._ready = sent.ready

            def wait() -> tuple[int, dict[int, int]]:
                sent.result()
                return self._after(positions, batch)
            return wait
        return start

    def _write(self, positions: Sequence[tuple[int, int]], batch: UpdateBatch
               ) -> tuple[int, dict[int, int]]:
        self.store.write_positioned(self.topic, positions, batch, self.group)
        return self._after(positions, batch)

    def _after(self, positions: Sequence[tuple[int, int]], batch: UpdateBatch
               ) -> tuple[int, dict[int, int]]:
        """Once the tiles (and positions) are applied: dead letters, counts, offsets to commit."""
        if batch.rejected:
            fields = {}
            for r in batch.rejected:
                part, off = positions[r.tag]
                fields[f"{part}:{off}"] = orjson.dumps({"reason": r.reason,
                                                        "event": r.raw.decode(errors="replace")})
            self.store.client.hset(dead_letter_key(self.topic), mapping=fields)
        self.freshness.record(batch.event_ts, time.time_ns())
        self.counts.add(len(batch.accepted), batch.rejected)
        offsets: dict[int, int] = {}
        for part, off in positions:
            if off + 1 > offsets.get(part, -1):
                offsets[part] = off + 1
        return len(positions), offsets

    def _commit(self, offsets: Mapping[int, int], asynchronous: bool) -> None:
        if not offsets:
            return
        from confluent_kafka import KafkaException, TopicPartition

        tps = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
        try:
            self.consumer.commit(offsets=tps, asynchronous=asynchronous)
        except KafkaException:
            pass  # e.g. the partition was revoked meanwhile: its next owner replays, marks skip

    def _on_revoke(self, consumer: Any, partitions: Any) -> None:
        """Before partitions move to another member: finish the write in flight and commit
        synchronously, so the next owner starts where this one stopped (less to replay)."""
        wait, self._inflight = self._inflight, None
        self._ready = None
        if wait is not None:
            try:
                _, offsets = wait()
                self.applied.update(offsets)
                self._to_commit.update(offsets)
            except Exception:  # noqa: BLE001 - store down: the next owner replays, marks skip
                pass
        self._commit_pending(asynchronous=False)
        for tp in partitions:  # if one comes back, its lag is measured from the group's offset
            self.applied.pop(tp.partition, None)
