"""Per-worker load figures the supervisor can read without asking a worker anything.

Each worker owns one slot of a small file mapped into every process (passed down as a file
descriptor): requests in flight, requests finished, and the p99 of its recent requests. The
autoscaler reads the slots; a worker never blocks on the supervisor, and a dead worker's slot is
simply reset when its replacement starts.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import time
from typing import Any

_SLOT = struct.Struct("<qqqq")  # in_flight, finished, p99_us, pid
MAX_SLOTS = 256


class LoadBoard:
    """The shared slots: the supervisor creates it, each worker opens it by descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, _SLOT.size * MAX_SLOTS)

    @classmethod
    def create(cls) -> LoadBoard:
        fd, path = tempfile.mkstemp(prefix="redline-load-")
        os.unlink(path)  # lives as long as a process holds the descriptor
        os.ftruncate(fd, _SLOT.size * MAX_SLOTS)
        os.set_inheritable(fd, True)
        return cls(fd)

    def write(self, slot: int, in_flight: int, finished: int, p99_us: int, pid: int) -> None:
        _SLOT.pack_into(self._map, slot * _SLOT.size, in_flight, finished, p99_us, pid)

    def read(self, slot: int) -> tuple[int, int, int, int]:
        values: tuple[int, int, int, int] = _SLOT.unpack_from(self._map, slot * _SLOT.size)
        return values

    def reset(self, slot: int) -> None:
        self.write(slot, 0, 0, 0, 0)


class LoadMeter:
    """ASGI wrapper that counts a worker's in-flight requests and recent latency into its slot."""

    def __init__(self, app: Any, board: LoadBoard, slot: int, window: int = 512) -> None:
        self.app = app
        self.board = board
        self.slot = slot
        self.in_flight = 0
        self.finished = 0
        self._recent: list[int] = []
        self._window = window
        self._p99_us = 0
        self._pid = os.getpid()
        self._published = 0.0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter_ns()
        self.in_flight += 1
        self._publish()
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self.finished += 1
            recent = self._recent
            recent.append(time.perf_counter_ns() - start)
            if len(recent) > self._window:
                del recent[: len(recent) - self._window]
            self._publish()

    def _publish(self) -> None:
        now = time.monotonic()
        if now - self._published > 0.25 and self._recent:
            ordered = sorted(self._recent)
            self._p99_us = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] // 1000
            self._published = now
        self.board.write(self.slot, self.in_flight, self.finished, self._p99_us, self._pid)
