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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from concurrent.futures import Future as ThreadFuture
from typing import Any

import numpy as np

Result = tuple[np.ndarray, np.ndarray]


class FeatureFetcher:
    """Coalesces concurrent ``reader.read`` calls of one route into one call on ``executor``."""

    def __init__(self, read: Callable[[dict[str, list[str]]], Result], executor: Executor,
                 entities: list[str]) -> None:
        self._read = read
        self._executor = executor
        self._entities = entities
        self._pending: list[tuple[dict[str, list[str]], int, asyncio.Future[Result]]] = []
        self._busy = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.calls = 0  # store calls made
        self.requests = 0  # requests served by them

    def read(self, ids: dict[str, list[str]], rows: int) -> asyncio.Future[Result]:
        """A future of (features, missing) for these rows; fails with the store's exception."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._pending.append((ids, rows, future))
        if not self._busy:
            self._launch()
        return future

    def _launch(self) -> None:
        batch, self._pending = self._pending, []
        batch = [b for b in batch if not b[2].done()]  # timed out while queued: not read
        if not batch:
            return
        if len(batch) == 1:
            merged = batch[0][0]
        else:
            merged = {e: [i for ids, _, _ in batch for i in ids[e]] for e in self._entities}
        self._busy = True
        self.calls += 1
        self.requests += len(batch)
        loop = self._loop
        assert loop is not None
        work = self._executor.submit(self._read, merged)

        def done(f: ThreadFuture[Result]) -> None:
            loop.call_soon_threadsafe(self._done, batch, f)

        work.add_done_callback(done)

    def _done(self, batch: list[Any], work: ThreadFuture[Result]) -> None:
        self._busy = False
        exc = work.exception()
        if exc is not None:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            feats, missing = work.result()
            offset = 0
            for _, rows, future in batch:
                end = offset + rows
                if not future.done():
                    future.set_result((feats[offset:end], missing[offset:end]))
                offset = end
        if self._pending:
            self._launch()
