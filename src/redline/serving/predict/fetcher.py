"""Feature reads off the event loop, coalesced: one store call for every request waiting.

Why a worker thread and not a blocking call on the loop: a blocking read holds the loop for the
whole Redis round trip (~0.1 ms on loopback, up to the socket timeout when Redis is sick), so
concurrent requests queue behind it one round trip each, health checks stall, and a request's
budget cannot cut the wait short. Here the loop hands the read to one worker thread and keeps
parsing; requests that arrive while a read is in flight ride the next read together — one
EVALSHA for all their entities (the store reads any number of entities in one round trip), the
"natural batching" of ``serving/batcher.py`` applied to features. The caller waits at most until
its own timeout and then degrades; a late result is dropped.

The embedded memory store is read inline: it is a dict lookup, cheaper than any thread hop.

Two rules keep one client from hurting another. A coalesced read is joined to its requests by
entity key, never by position: each distinct key is read once and every request takes the rows
of its own keys, so a request whose ids are malformed cannot shift anyone else's rows. And the
store's health (the circuit breaker) is judged by the store call itself, when it ends, not by a
waiting request giving up: a read cut short by one client's tight budget is not a store failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from concurrent.futures import Future as ThreadFuture
from typing import Any

import numpy as np

# (features, missing) and, read from the store (``read_timed``), the newest event time per view
Result = tuple[np.ndarray, ...]
Start = Callable[[dict[str, list[str]], Callable[[Result | None, BaseException | None], None]],
                 None]


class FeatureFetcher:
    """Coalesces concurrent ``reader.read`` calls of one route into one call on ``executor``.

    ``health`` is told how each store call ended (``None`` for success, else the exception).
    """

    def __init__(self, read: Callable[[dict[str, list[str]]], Result], executor: Executor,
                 entities: Sequence[str],
                 health: Callable[[BaseException | None], None] | None = None,
                 *, start: Start | None = None) -> None:
        self._read = read
        self._executor = executor
        # ``start(ids, done)`` begins a read on the event loop itself and calls ``done(result,
        # exc)`` there (``redis_loop.py``: Redis over the loop's own socket); without it
        # ``read`` runs on ``executor``.
        self._start = start
        self._entities = list(entities)
        self._health = health
        self._pending: list[tuple[dict[str, list[str]], int, asyncio.Future[Result]]] = []
        self._busy = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.calls = 0  # store calls made
        self.requests = 0  # requests served by them
        self.waiting = 0  # requests whose read has not ended (in flight or queued)

    def read(self, ids: dict[str, list[str]], rows: int) -> asyncio.Future[Result]:
        """A future of (features, missing) for these rows; fails with the store's exception."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self.waiting += 1
        future.add_done_callback(self._ended)
        self._pending.append((ids, rows, future))
        if not self._busy:
            self._launch()
        return future

    def _ended(self, _: asyncio.Future[Result]) -> None:
        self.waiting -= 1

    def _launch(self) -> None:
        batch, self._pending = self._pending, []
        batch = [b for b in batch if not b[2].done()]  # timed out while queued: not read
        if not batch:
            return
        if len(batch) == 1:
            merged, index = batch[0][0], None
        else:
            merged, index = self._join(batch)
        self._busy = True
        self.calls += 1
        self.requests += len(batch)
        if self._start is not None:
            def finished(result: Result | None, exc: BaseException | None) -> None:
                self._done(batch, index, result, exc)

            try:
                self._start(merged, finished)
            except Exception as exc:  # noqa: BLE001 - e.g. bad ids: the waiters get the error
                self._done(batch, index, None, exc)
            return
        loop = self._loop
        assert loop is not None
        work = self._executor.submit(self._read, merged)

        def done(f: ThreadFuture[Result]) -> None:
            exc = f.exception()
            loop.call_soon_threadsafe(self._done, batch, index,
                                      None if exc is not None else f.result(), exc)

        work.add_done_callback(done)

    def _join(self, batch: list[Any]) -> tuple[dict[str, list[str]], list[np.ndarray]]:
        """One read of every distinct entity key, and each request's row numbers in it."""
        entities = self._entities
        position: dict[tuple[str, ...], int] = {}
        index: list[np.ndarray] = []
        for ids, rows, _ in batch:
            columns = [ids[e] for e in entities]
            rows_at = np.empty(rows, dtype=np.intp)
            for r in range(rows):
                key = tuple(col[r] for col in columns)
                at = position.get(key)
                if at is None:
                    at = position[key] = len(position)
                rows_at[r] = at
            index.append(rows_at)
        keys = list(position)
        merged = {e: [k[j] for k in keys] for j, e in enumerate(entities)}
        return merged, index

    def _done(self, batch: list[Any], index: list[np.ndarray] | None,
              result: Result | None, exc: BaseException | None) -> None:
        self._busy = False
        if self._health is not None:
            self._health(exc)
        if exc is not None:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        elif index is None:
            future = batch[0][2]
            if not future.done():
                future.set_result(result)
        else:
            assert result is not None
            for (_, _, future), rows_at in zip(batch, index, strict=True):
                if not future.done():
                    future.set_result(tuple(part[rows_at] for part in result))
        if self._pending:
            self._launch()
