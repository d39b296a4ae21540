"""Kinesis source: every shard of a stream read with boto3, exactly-once effect on Redis.

Exactly once, as for Kafka (``kafka.py``), with one difference: a Kinesis sequence number is a
decimal of up to 129 digits (56 in practice), beyond a double's 2^53, so it is kept as its
decimal string, never as a number.

1. Records of every shard that is due are read (``GetRecords``) and decoded by the shared
   decoder; each event keeps its (shard, sequence number).
2. ``RedisStore.write_sequenced`` applies the tile updates and, *in the same Lua call*, records
   per key and shard the highest sequence number applied to that key (field
   ``@k:<stream>:<shard>``, 129 zero-padded digits, compared exactly). An update at or below
   that mark is skipped. On a cluster each call covers one slot, so it stays atomic.
3. Only then is each shard's last sequence number stored as its checkpoint (the hash
   :func:`checkpoint_key`). A crash before that re-reads the records after the previous
   checkpoint, and step 2 skips what was applied.

A reshard (split or merge) closes the parent shards: a child is read only once each of its
parents is drained (read to its end and checkpointed as ``SHARD_END``), so an entity's events
are applied in order across the reshard. ``ProvisionedThroughputExceededException`` backs the
shard off (doubling, up to 5 s); an expired iterator is made again after the last record read.
Arrival time is the record's ``ApproximateArrivalTimestamp``, so a replay is admitted exactly as
the first read was.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from redline.errors import ConfigError
from redline.features.definitions import FeatureDefinitions
from redline.features.events import EventDecoder
from redline.features.ingest.core import Freshness, IngestCounts, hand_off_sessions
from redline.features.online.base import now_ms
from redline.features.sessions import SessionSink

log = logging.getLogger("redline.ingest")

SHARD_END = "SHARD_END"  # a shard's checkpoint once it is closed and drained
MIN_CALL_S = 0.2  # Kinesis allows five GetRecords a second per shard
MAX_BACKOFF_S = 5.0
REFRESH_S = 60.0  # shards are listed again this often (and whenever one ends)


def _boto3() -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise ConfigError("Kinesis ingest needs the AWS client: pip install 'redline[kinesis]'"
                          ) from exc
    return boto3, Config


def checkpoint_key(stream: str) -> str:
    """Hash of the stream's checkpoints: field shard id -> the last sequence number applied (a
    decimal string), or ``SHARD_END`` once the shard is drained."""
    return f"redline:kinesis:{stream}:shards"


def dead_letter_key(stream: str) -> str:
    """Hash of dead letters of ``stream``: field ``shard:sequence number`` -> reason and raw
    record. Written by position, so a replayed batch writes the same fields again."""
    return f"redline:dead:kinesis:{stream}"


@dataclass
class Shard:
    """One shard as this process reads it."""

    id: str
    parents: tuple[str, ...] = ()
    state: str = "waiting"  # waiting (for its parents) | reading | ended
    iterator: str | None = None
    read: str | None = None  # sequence number of the last record read
    applied: str | None = None  # ... and of the last one applied and checkpointed
    behind_ms: int | None = None  # MillisBehindLatest of the last GetRecords
    records: int = 0  # records applied by this process
    due: float = 0.0  # monotonic time of the next GetRecords
    backoff: float = 0.0
    closed: bool = False  # GetRecords said the shard has no more records (no next iterator)
    pending: list[Any] = field(default_factory=list)


class KinesisSource:
    """Reads every shard of ``stream`` into a Redis store (single or cluster)."""

    source_kind = "kinesis"  # the ingest metrics' ``source`` label

    def __init__(self, defs: FeatureDefinitions, store: Any, *, stream: str,
                 region: str | None = None, endpoint_url: str | None = None,
                 batch: int = 1000, block_ms: int = 100, client: Any = None,
                 source: str | None = None, consumer: str | None = None,
                 sessions: SessionSink | None = None,
                 client_config: Mapping[str, Any] | None = None) -> None:
        if store.kind != "redis":  # a RedisStore (its module, and Redis's client, load on use)
            raise ConfigError("Kinesis ingest writes to a shared store: set features.store: redis")
        self.store = store
        self.sessions = sessions
        self.stream = stream
        self.batch = min(batch, 10000)  # GetRecords returns at most 10,000 records
        self.block_s = block_ms / 1000.0
        self.decoder = EventDecoder(defs, source)
        self.counts = IngestCounts()
        self.freshness = Freshness()
        self.name = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.endpoint = endpoint_url or "the AWS endpoint"
        self.client = client if client is not None else self._client(region, endpoint_url,
                                                                     client_config)
        self.shards: dict[str, Shard] = {}
        self.throttled = 0
        self.expired_iterators = 0
        self.errors = 0
        self._listed = 0.0
        self._relist = True
        self._down_since: float | None = None
        self._check_stream()

    # -- the Source interface -----------------------------------------------------------------

    def poll(self) -> int:
        """Read the shards that are due, apply their records in one atomic write, checkpoint."""
        now = time.monotonic()
        if self._relist or now - self._listed >= REFRESH_S:
            if not self._call_kinesis(self._list_shards):
                return 0
        due = [s for s in self.shards.values() if s.state == "reading" and s.due <= now]
        if not due:
            self._sleep_until_due()
            return 0
        records: list[tuple[Shard, Any]] = []
        for shard in due:
            got = self._call_kinesis(lambda s=shard: self._get_records(s))
            if got:
                records += [(shard, r) for r in shard.pending]
                shard.pending = []
        n = self._apply(records)
        self._end_drained(due)
        return n

    def flush(self) -> int:
        return 0  # every write is finished when poll returns

    def reset(self) -> None:
        """After a store outage: the last batch was applied or not; read on from the stored
        checkpoints (the marks skip what was applied)."""
        self.shards.clear()
        self._relist = True

    @property
    def source_name(self) -> str:
        """What the ingest metrics name this source by: its stream."""
        return self.stream

    def consumer_lag(self) -> list[tuple[str, str, int]]:
        """None: Kinesis says how far behind in time (``behind_latest``), not in records."""
        return []

    def behind_latest(self) -> list[tuple[str, str, int]]:
        """[(stream, shard, MillisBehindLatest)] of the shards being read (an ended shard: 0)."""
        return [(self.stream, s.id, 0 if s.state == "ended" else (s.behind_ms or 0))
                for s in sorted(self.shards.values(), key=lambda s: s.id)
                if s.behind_ms is not None or s.state == "ended"]

    def stats(self) -> dict[str, Any]:
        return {"consumer": self.name, "stream": self.stream,
                "reading": sorted(s.id for s in self.shards.values() if s.state == "reading"),
                "shards": {s.id: {"state": s.state, "behind_ms": s.behind_ms,
                                  "records": s.records, "position": s.applied}
                           for s in sorted(self.shards.values(), key=lambda s: s.id)},
                "accepted": self.counts.accepted, "dead": self.counts.dead,
                "dead_by_reason": dict(self.counts.by_reason), "throttled": self.throttled,
                "expired_iterators": self.expired_iterators, "errors": self.errors,
                "freshness": self.freshness.summary()}

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            close()

    # -- Kinesis ------------------------------------------------------------------------------

    def _client(self, region: str | None, endpoint_url: str | None,
                extra: Mapping[str, Any] | None) -> Any:
        boto3, config = _boto3()
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if not region:
            raise ConfigError("Kinesis ingest needs a region: pass --region, set "
                              "features.kinesis_region or the AWS_REGION environment variable")
        # no retries inside botocore: a throttled shard is backed off here, the others go on
        cfg = config(retries={"mode": "standard", "total_max_attempts": 1},
                     connect_timeout=5, read_timeout=10, **dict(extra or {}))
        return boto3.client("kinesis", region_name=region, endpoint_url=endpoint_url,
                            config=cfg)

    def _check_stream(self) -> None:
        """The stream exists and the credentials are accepted: said now, not as a loop of
        warnings."""
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
        )

        try:
            self.client.describe_stream_summary(StreamName=self.stream)
        except NoCredentialsError:
            raise ConfigError("Kinesis ingest found no AWS credentials: set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run where a role gives "
                              "them") from None
        except EndpointConnectionError as exc:
            raise ConfigError(f"Kinesis is not reachable at {exc.kwargs.get('endpoint_url')}: "
                              "check --endpoint-url / --region and the network") from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ResourceNotFoundException":
                raise ConfigError(f"Kinesis stream '{self.stream}' does not exist at "
                                  f"{self.endpoint}: create it, or name another with "
                                  "--stream") from None
            raise ConfigError(f"Kinesis refused to describe stream '{self.stream}': "
                              f"{code}: {exc.response.get('Error', {}).get('Message', '')}"
                              ) from None

    def _call_kinesis(self, fn: Any) -> bool:
        """Run one Kinesis step; an unreachable endpoint or a server error is logged once per
        outage and retried later (nothing read is lost: checkpoints only follow the tiles)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            fn()
        except (BotoCoreError, ClientError) as exc:
            self.errors += 1
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning("ingest: Kinesis stream %s at %s failed (%s); retrying every %.0f s",
                            self.stream, self.endpoint, exc, MAX_BACKOFF_S / 5)
            for s in self.shards.values():
                s.due = max(s.due, time.monotonic() + MAX_BACKOFF_S / 5)
            time.sleep(min(self.block_s, MAX_BACKOFF_S / 5))
            return False
        if self._down_since is not None:
            log.warning("ingest: Kinesis stream %s reachable again after %.1f s", self.stream,
                        time.monotonic() - self._down_since)
            self._down_since = None
        return True

    def _list_shards(self) -> None:
        """Learn the stream's shards (new children after a reshard) and where each resumes."""
        listed: dict[str, tuple[str, ...]] = {}
        kwargs: dict[str, Any] = {"StreamName": self.stream}
        while True:
            page = self.client.list_shards(**kwargs)
            for sh in page.get("Shards", []):
                parents = tuple(p for p in (sh.get("ParentShardId"),
                                            sh.get("AdjacentParentShardId")) if p)
                listed[sh["ShardId"]] = parents
            token = page.get("NextToken")
            if not token:
                break
            kwargs = {"NextToken": token}
        stored = self._redis(lambda c: c.hgetall(checkpoint_key(self.stream)))
        marks = {k.decode(): v.decode() for k, v in stored.items()}
        for sid, parents in listed.items():
            if sid not in self.shards:
                shard = self.shards[sid] = Shard(sid, parents)
                mark = marks.get(sid)
                if mark == SHARD_END:
                    shard.state = "ended"
                else:
                    shard.applied = shard.read = mark
        for shard in self.shards.values():
            if shard.state == "waiting" and all(
                    p not in self.shards or self.shards[p].state == "ended"  # gone: expired
                    for p in shard.parents):
                shard.state = "reading"
        self._listed = time.monotonic()
        self._relist = False

    def _iterator(self, shard: Shard) -> str:
        if shard.read is None:
            got = self.client.get_shard_iterator(StreamName=self.stream, ShardId=shard.id,
                                                 ShardIteratorType="TRIM_HORIZON")
        else:
            got = self.client.get_shard_iterator(
                StreamName=self.stream, ShardId=shard.id,
                ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=shard.read)
        return str(got["ShardIterator"])

    def _get_records(self, shard: Shard) -> None:
        """One GetRecords into ``shard.pending``; throttling backs the shard off."""
        from botocore.exceptions import ClientError

        now = time.monotonic()
        shard.due = now + MIN_CALL_S
        try:
            if shard.iterator is None:
                shard.iterator = self._iterator(shard)
            got = self.client.get_records(ShardIterator=shard.iterator, Limit=self.batch)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ExpiredIteratorException":
                # made again after the last record read, on the next round
                self.expired_iterators += 1
                shard.iterator = None
                shard.due = now
                return
            if code in ("ProvisionedThroughputExceededException", "LimitExceededException"):
                self.throttled += 1
                shard.backoff = min(MAX_BACKOFF_S, max(MIN_CALL_S, shard.backoff * 2))
                shard.due = now + shard.backoff * (0.5 + random.random() / 2)
                return
            raise
        shard.backoff = 0.0
        shard.pending = got.get("Records", [])
        if shard.pending:
            shard.read = shard.pending[-1]["SequenceNumber"]
        shard.behind_ms = int(got.get("MillisBehindLatest", 0))
        shard.iterator = got.get("NextShardIterator")
        if shard.iterator is None:
            shard.closed = True  # a closed shard, read to its end
        elif shard.pending and (shard.behind_ms > 0 or len(shard.pending) >= self.batch):
            shard.due = now  # a backlog: read on at once (throttling backs off if too fast)

    # -- the store ----------------------------------------------------------------------------

    def _apply(self, records: list[tuple[Shard, Any]]) -> int:
        """One atomic write of the records' tiles and marks; then dead letters, checkpoints."""
        if not records:
            return 0
        positions = [(shard.id, r["SequenceNumber"]) for shard, r in records]
        arrivals = []
        for _, r in records:
            ts = r.get("ApproximateArrivalTimestamp")
            arrivals.append(int(ts.timestamp() * 1000) if ts is not None else now_ms())
        batch = self.decoder.decode([r["Data"] for _, r in records], arrivals)
        hand_off_sessions(batch, self.sessions)  # before the write their positions follow
        self.store.write_sequenced(self.stream, positions, batch)
        if batch.rejected:
            fields = {}
            for rej in batch.rejected:
                sid, seq = positions[rej.tag]
                fields[f"{sid}:{seq}"] = orjson.dumps(
                    {"reason": rej.reason, "event": rej.raw.decode(errors="replace")})
            self._redis(lambda c: c.hset(dead_letter_key(self.stream), mapping=fields))
        self.freshness.record(batch.event_ts, time.time_ns())
        self.counts.add(len(batch.accepted), batch.rejected)
        last: dict[str, str] = {}
        for shard, r in records:
            shard.records += 1
            last[shard.id] = shard.applied = r["SequenceNumber"]
        self._redis(lambda c: c.hset(checkpoint_key(self.stream), mapping=last))
        return len(records)

    def _end_drained(self, shards: list[Shard]) -> None:
        """Closed shards whose records are all applied: checkpointed as ended, so their
        children may be read (after a listing, which finds them)."""
        ended = [s for s in shards if s.closed and not s.pending and s.state == "reading"]
        if not ended:
            return
        self._redis(lambda c: c.hset(checkpoint_key(self.stream),
                                     mapping={s.id: SHARD_END for s in ended}))
        for s in ended:
            s.state = "ended"
            s.behind_ms = 0
        self._relist = True

    def _redis(self, call: Callable[[Any], Any]) -> Any:
        """A call on the store's client; an outage becomes ``StoreUnavailable`` (the loop waits
        it out and resumes from the checkpoints)."""
        from redline.features.online.redis_client import guarded

        return guarded(self.store.url, lambda: call(self.store.client))

    def _sleep_until_due(self) -> None:
        reading = [s.due for s in self.shards.values() if s.state == "reading"]
        wait = min(reading) - time.monotonic() if reading else self.block_s
        time.sleep(max(0.0, min(wait, self.block_s)))
