"""Ingest: apply events to an online store, from Redis Streams, HTTP push or file replay.

* :class:`Ingestor` — in-process: validate, apply, dead-letter, count, measure freshness.
* :class:`StreamConsumer` — one member of a Redis Streams consumer group. Each batch is applied
  by one Lua call that also acks it (``RedisStore.write_from_stream``), and entries of dead
  consumers are taken over with XAUTOCLAIM, so SIGKILL at any instant loses and repeats nothing.
* :func:`events_asgi_app` / :func:`handle_events` — ``POST /v1/events`` (a JSON array, one
  object, or JSON lines), mountable in the serving app.
* :func:`replay_file` — JSONL/CSV/Parquet backfill.
"""

from __future__ import annotations

import collections
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from redline.errors import InvalidInput, PayloadTooLarge
from redline.features.definitions import FeatureDefinitions
from redline.features.events import EventDecoder, Rejected, UpdateBatch
from redline.features.online.base import OnlineStore, now_ms


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


@dataclass
class IngestResult:
    accepted: int
    rejected: list[Rejected]


class Ingestor:
    """Validates and applies events to one store; dead letters are kept (last ``keep_dead``) and,
    for a Redis store, appended to the ``dead_stream``."""

    def __init__(self, defs: FeatureDefinitions, store: OnlineStore, *, source: str | None = None,
                 dead_stream: str = "redline:events:dead", keep_dead: int = 1000) -> None:
        self.defs = defs
        self.store = store
        self.decoder = EventDecoder(defs, source)
        self.counts = IngestCounts()
        self.freshness = Freshness()
        self.dead_letters: collections.deque[Rejected] = collections.deque(maxlen=keep_dead)
        self.dead_stream = dead_stream
        register = getattr(store, "register", None)
        if register is not None:
            register(list(defs.views.values()))

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
        self.store.write(batch)
        if measure:
            self.freshness.record(batch.event_ts, time.time_ns())
        self.counts.add(len(batch.accepted), batch.rejected)
        if batch.rejected:
            self.dead_letters.extend(batch.rejected)
            client = getattr(self.store, "client", None)
            if client is not None:
                pipe = client.pipeline(transaction=False)
                for r in batch.rejected:
                    pipe.xadd(self.dead_stream, {"reason": r.reason, "event": r.raw},
                              maxlen=100000, approximate=True)
                pipe.execute()

    def stats(self) -> dict[str, Any]:
        return {"accepted": self.counts.accepted, "dead": self.counts.dead,
                "dead_by_reason": dict(self.counts.by_reason),
                "freshness": self.freshness.summary()}


def _stream_ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


class StreamConsumer:
    """One consumer of a Redis Streams consumer group applying events exactly once."""

    def __init__(self, defs: FeatureDefinitions, store: Any, *, stream: str, group: str,
                 consumer: str | None = None, batch: int = 1000, claim_idle_ms: int = 30000,
                 block_ms: int = 100, source: str | None = None) -> None:
        self.store = store
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
        self._inflight: Future[int] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="redline-ingest-write")
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
        return ids, self.decoder.decode([e[1] for e in entries], arrivals)

    def _write(self, ids: list[bytes], batch: UpdateBatch) -> int:
        acked, accepted, dead = self.store.write_from_stream(
            self.stream, self.group, self.consumer, ids, batch)
        if acked:
            self.freshness.record(batch.event_ts, time.time_ns())
            self.counts.accepted += accepted
            self.counts.dead += dead
        return int(acked)

    def _apply(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> int:
        """Decode and apply synchronously; returns entries applied (0 if claimed by another)."""
        if not entries:
            return 0
        return self._write(*self._decode(entries))

    def flush(self) -> int:
        """Wait for the batch in flight; returns its applied count."""
        fut, self._inflight = self._inflight, None
        return fut.result() if fut is not None else 0

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

    def poll(self) -> int:
        """:meth:`step`, with a lost Redis connection raised as ``StoreUnavailable``; the
        consumer stays usable: call :meth:`reset` and poll again once Redis is back."""
        from redline.features.online.redis import guarded

        return guarded(self.store.url, self.step)

    def reset(self) -> None:
        """After an outage: forget the write in flight (its outcome is in Redis: applied and
        acked, or still pending and re-read), re-create the group if Redis came back empty."""
        fut, self._inflight = self._inflight, None
        if fut is not None:
            try:
                fut.result()
            except Exception:  # noqa: BLE001 - the outage itself; the entries stay pending
                pass
        self._recovered = False
        self.ensure_group()

    def step(self) -> int:
        """One step: claim if due, then read new entries (blocking up to ``block_ms``).

        The next batch is read and decoded while the previous one runs in Redis (one write in
        flight, on its own connection); each write is atomic and checks ownership, so the
        overlap changes nothing about exactly-once. Returns entries applied in this step.
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
        resp = self.client.xreadgroup(self.group, self.consumer, {self.stream: ">"},
                                      count=self.batch, block=self.block_ms)
        entries = [e for e in (resp[0][1] if resp else []) if e[1]]
        if not entries:
            return done + self.flush()
        ids, batch = self._decode(entries)
        done += self.flush()
        self._inflight = self._pool.submit(self._write, ids, batch)
        return done

    def run(self, stop: Callable[[], bool] = lambda: False, max_events: int | None = None) -> None:
        seen = 0
        try:
            while not stop():
                seen += self.poll()
                if max_events is not None and seen >= max_events:
                    return
        finally:
            self.flush()

    def stats(self) -> dict[str, Any]:
        remote = {k.decode(): int(v) for k, v in
                  self.client.hgetall(f"{self.stream}:stats").items()}
        return {"consumer": self.consumer, "accepted": self.counts.accepted,
                "dead": self.counts.dead, "claimed": self.claimed, "stream_totals": remote,
                "freshness": self.freshness.summary()}


def replay_file(ingestor: Ingestor, path: str | Path, *, batch: int = 5000,
                arrival_column: str = "_arrival_ms") -> IngestResult:
    """Backfill from JSONL/CSV/Parquet, read exactly as ``training-set`` reads it (the same
    ``offline.read_events``); arrival = ``arrival_column`` or the event time itself."""
    from redline.features.offline import arrival_of, read_events

    log = read_events(path)
    raws: list[Any] = []
    arrivals = []
    for raw in log.raws:
        obj = raw
        if isinstance(raw, bytes):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                obj = None
        raws.append(raw)
        ms = arrival_of(obj, ingestor.decoder, arrival_column)
        arrivals.append(ms or now_ms())
    accepted = 0
    rejected: list[Rejected] = []
    for i in range(0, len(raws), batch):
        chunk = raws[i:i + batch]
        decoded = ingestor.decoder.decode(chunk, arrivals[i:i + batch], flat=log.flat)
        ingestor.apply(decoded, measure=False)
        accepted += len(decoded.accepted)
        for r in decoded.rejected:
            rejected.append(Rejected(r.reason, r.raw, r.tag + i))
    return IngestResult(accepted, rejected)


# --- HTTP push -------------------------------------------------------------------------------

def parse_body(body: bytes, max_events: int = 100_000) -> list[Any]:
    """A JSON array of events, one JSON object, or JSON lines → raw events (each validated
    later, so one bad event does not reject the batch)."""
    text = body.strip()
    if not text:
        raise InvalidInput("empty body: send a JSON array of events, one object, or JSON lines")
    try:
        whole = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if text[:1] == b"[" or b"\n" not in text:
            raise InvalidInput(f"body is not valid JSON: {exc}") from exc
        whole = None  # JSON lines: each line is parsed (and dead-lettered) on its own
    raws: list[Any]
    if whole is None:
        raws = [ln for ln in text.splitlines() if ln.strip()]
    elif isinstance(whole, list):
        raws = [x if isinstance(x, dict) else orjson.dumps(x) for x in whole]
    else:
        raws = [whole if isinstance(whole, dict) else text]
    if len(raws) > max_events:
        raise PayloadTooLarge(f"{len(raws)} events in one request; send at most {max_events}")
    return raws


async def handle_events(ingestor: Ingestor, body: bytes) -> tuple[int, bytes]:
    """``POST /v1/events``: 200 with counts and per-event reasons; 4xx for a bad body, 503 when
    the store is unreachable (nothing was applied: the sender retries)."""
    from redline.errors import RedlineError

    try:
        raws = parse_body(body)
        res = ingestor.ingest(raws)
    except RedlineError as exc:
        return exc.http_status, orjson.dumps(exc.to_v2())
    return 200, orjson.dumps({
        "accepted": res.accepted, "rejected": len(res.rejected),
        "errors": [{"index": r.tag, "reason": r.reason} for r in res.rejected[:100]],
    })


ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                    Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]


def events_asgi_app(ingestor: Ingestor, max_body_bytes: int = 16 * 1024 * 1024) -> ASGIApp:
    """A tiny ASGI app: ``POST /v1/events``, ``GET /v1/ingest/stats``, ``GET /healthz``."""
    from redline.errors import RedlineError

    async def send_json(send: Any, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path, method = scope["path"], scope["method"]
        if path == "/healthz":
            return await send_json(send, 200, b'{"status":"ok"}')
        if path == "/v1/ingest/stats" and method == "GET":
            return await send_json(send, 200, orjson.dumps(ingestor.stats()))
        if path != "/v1/events":
            return await send_json(send, 404, b'{"error":"not found: POST /v1/events",'
                                              b'"code":"not_found"}')
        if method != "POST":
            return await send_json(send, 405, b'{"error":"use POST","code":"method_not_allowed"}')
        chunks = []
        size = 0
        more = True
        while more:
            msg = await receive()
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > max_body_bytes:
                err = PayloadTooLarge(f"body larger than {max_body_bytes} bytes; split the batch")
                return await send_json(send, err.http_status, orjson.dumps(err.to_v2()))
            chunks.append(chunk)
            more = msg.get("more_body", False)
        try:
            status, body = await handle_events(ingestor, b"".join(chunks))
        except RedlineError as exc:
            status, body = exc.http_status, orjson.dumps(exc.to_v2())
        await send_json(send, status, body)

    return app
