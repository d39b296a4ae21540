"""``POST /v1/events``: the write leaves the event loop.

A batch of events is one Redis write of tens of milliseconds (a slow Redis: far longer). In a
server, on the event loop, it stalled every request in flight (and under the request path's 50 ms
timeout a loaded machine turned pushes away with a 503). So with a Redis store the write runs on
one thread, through a connection with the ingest timeout: the loop goes on serving, and batches
apply in the order they arrived. A push that finds ``max_waiting`` others waiting behind the
one being written is refused at once with a 503 (nothing of it applied): a hung Redis holds a
bounded queue, not every sender. The memory store is written on the loop, where it is read (a
write is microseconds and needs no lock).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redline.errors import StoreUnavailable
from redline.features.ingest.core import Ingestor, IngestResult

MAX_WAITING = 64  # pushes queued behind the one being written; more are refused with a 503


class EventPush:
    """Applies pushed events with ``ingestor()`` (built on first use, on the write thread)."""

    def __init__(self, ingestor: Callable[[], Ingestor], on_loop: bool,
                 max_waiting: int = MAX_WAITING) -> None:
        self._ingestor = ingestor
        self._on_loop = on_loop
        self._max_waiting = max_waiting
        self._waiting = 0
        self._thread: ThreadPoolExecutor | None = None

    async def apply(self, raws: Sequence[Any]) -> IngestResult:
        if self._on_loop:
            return self._write(raws)
        if self._waiting > self._max_waiting:
            raise StoreUnavailable(
                f"{self._waiting} event pushes are waiting for the online store; nothing of "
                "this one was applied: send it again after a short pause")
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="redline-events-write")
        self._waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._thread, self._write, raws)
        finally:
            self._waiting -= 1

    def _write(self, raws: Sequence[Any]) -> IngestResult:
        return self._ingestor().ingest(raws)

    def close(self) -> None:
        """Release the thread (at shutdown, after the drain): a push still queued then is not
        applied and its sender gets no answer, so it sends it again; a hung Redis does not hold
        the exit."""
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
