"""The ingest core: decoded events → tile updates applied atomically, with counts, dead letters
and freshness. Every source (Redis Streams, Kafka, file replay, HTTP push) ends here."""

from __future__ import annotations

import collections
import gc
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from redline.features.definitions import FeatureDefinitions
from redline.features.events import EventDecoder, raw_bytes
from redline.features.online.base import OnlineStore, now_ms
from redline.features.sessions import SESSION_SOURCE, SessionSink
from redline.features.updates import Rejected, UpdateBatch

NO_SESSIONS = (f"session: this ingest has no session store for events of source "
               f"'{SESSION_SOURCE}'; send them to a server or an ingest with features.store: redis")


def settle_heap() -> None:
    """Move what exists now (modules, clients, definitions) out of the garbage collector's
    reach: an ingest process lives for its loop, and a full collection walking the startup heap
    stalled a batch for ~55 ms."""
    gc.collect()
    gc.freeze()


class Freshness:
    """Event time → visible in the store, in microseconds (bounded reservoir of recent samples)."""

    def __init__(self, size: int = 65536) -> None:
        self.samples: collections.deque[float] = collections.deque(maxlen=size)

    def record(self, event_ts_ms: Sequence[int], visible_ns: int) -> None:
        if not event_ts_ms:
            return
        lag = visible_ns / 1000.0 - np.asarray(event_ts_ms, dtype=np.float64) * 1000.0
        self.samples.extend(lag.tolist())

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {"count": 0}
        arr = np.asarray(self.samples)
        p50, p99 = np.percentile(arr, [50, 99])
        return {"count": len(arr), "p50_ms": float(p50) / 1000, "p99_ms": float(p99) / 1000,
                "max_ms": float(arr.max()) / 1000}


@dataclass
class IngestCounts:
    accepted: int = 0
    dead: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)

    def add(self, accepted: int, rejected: Iterable[Rejected]) -> None:
        self.accepted += accepted
        for r in rejected:
            self.dead += 1
            cls = reason_class(r.reason)
            self.by_reason[cls] = self.by_reason.get(cls, 0) + 1


def reason_class(reason: str) -> str:
    """``"late: arrived ..."`` → ``"late"``; ``"missing field 'x'"`` → ``"missing"``."""
    return reason.split(":", 1)[0].split(" ", 1)[0]


def hand_off_sessions(batch: UpdateBatch, sessions: SessionSink | None) -> None:
    """Store the batch's session item events before its tiles are written (and its log
    positions with them): stored ones count as accepted, refused ones join the dead letters.
    A session store that is down raises, so the batch is not acknowledged and is read again;
    events of sessions stored before the outage are then stored again (at least once)."""
    events = batch.sessions
    if not events:
        return
    refused = (dict(sessions.add_stream_events(events)) if sessions is not None
               else {e.tag: NO_SESSIONS for e in events})
    for e in events:
        reason = refused.get(e.tag)
        if reason is None:
            batch.accepted.append(e.tag)
        else:
            batch.rejected.append(Rejected(reason, raw_bytes(e.event), e.tag))
    batch.sessions = []


@dataclass
class IngestResult:
    accepted: int
    rejected: list[Rejected]


class Ingestor:
    """Validates and applies events to one store; dead letters are kept (last ``keep_dead``) and,
    for a Redis store, appended to the ``dead_stream``."""

    def __init__(self, defs: FeatureDefinitions, store: OnlineStore, *, source: str | None = None,
                 dead_stream: str = "redline:events:dead", keep_dead: int = 1000,
                 sessions: SessionSink | None = None) -> None:
        self.defs = defs
        self.store = store
        self.sessions = sessions  # where session item events go (none: dead letters)
        self.decoder = EventDecoder(defs, source)
        self.counts = IngestCounts()
        self.freshness = Freshness()
        self.dead_letters: collections.deque[Rejected] = collections.deque(maxlen=keep_dead)
        self.dead_stream = dead_stream
        store.register(list(defs.views.values()))

    def ingest(self, raws: Sequence[Any], arrival_ms: int | Sequence[int] | None = None
               ) -> IngestResult:
        """Apply a batch; returns what was accepted and the dead letters (with reasons).
        Freshness is measured for live batches only (no ``arrival_ms``: arrival is now)."""
        live = arrival_ms is None
        arrival = now_ms() if arrival_ms is None else arrival_ms
        batch = self.decoder.decode(raws, arrival)
        self.apply(batch, measure=live)
        return IngestResult(len(batch.accepted), batch.rejected)

    def apply(self, batch: UpdateBatch, measure: bool = True) -> None:
        hand_off_sessions(batch, self.sessions)
        self.store.write(batch)
        if measure:
            self.freshness.record(batch.event_ts, time.time_ns())
        self.counts.add(len(batch.accepted), batch.rejected)
        if batch.rejected:
            self.dead_letters.extend(batch.rejected)
            self.store.add_dead_letters(self.dead_stream, batch.rejected)

    def stats(self) -> dict[str, Any]:
        return {"accepted": self.counts.accepted, "dead": self.counts.dead,
                "dead_by_reason": dict(self.counts.by_reason),
                "freshness": self.freshness.summary()}
