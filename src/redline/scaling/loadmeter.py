"""Per-worker load figures the supervisor can read without asking a worker anything.

Each worker owns one slot of a small file mapped into every process (passed down as a file
descriptor): requests in flight, requests finished, and the p99 of its recent requests. The
autoscaler reads the slots; a worker never blocks on the supervisor, and a dead worker's slot is
reset when it is found dead and again when its replacement starts. Beside the slots, each
worker's open HTTP connections, which the workers read of one another to share the connections
fairly (``scaling/accept.py``).

One :class:`LoadMeter` per worker counts both transports: REST through :class:`AsgiMeter` (the
ASGI app uvicorn runs) and gRPC - the V2 service and ``/v1`` - through :class:`GrpcMeter` (a
server interceptor), so a surge that arrives over gRPC scales the pool like one over REST.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:  # (the supervisor imports this module, not the serving package)
    from redline.serving.asgi import Asgi, Headers, InlineApp, Receive, Responder, Scope, Send

_SLOT = struct.Struct("<qqqq")  # in_flight, finished, p99_us, pid
MAX_SLOTS = 256
_CONNECTIONS = struct.Struct("<q")  # a worker's open HTTP connections; -1: not accepting
_CONNECTIONS_AT = _SLOT.size * MAX_SLOTS  # where the connection counts start, one per slot
_BOARD_BYTES = _CONNECTIONS_AT + _CONNECTIONS.size * MAX_SLOTS
_now_ns = time.perf_counter_ns


class LoadBoard:
    """The shared slots: the supervisor creates it, each worker opens it by descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, _BOARD_BYTES)
        self._views: tuple[Any, Any] | None = None  # (pids, connections): fewest_connections

    @classmethod
    def create(cls) -> LoadBoard:
        fd, path = tempfile.mkstemp(prefix="redline-load-")
        os.unlink(path)  # lives as long as a process holds the descriptor
        os.ftruncate(fd, _BOARD_BYTES)
        os.set_inheritable(fd, True)
        return cls(fd)

    def write(self, slot: int, in_flight: int, finished: int, p99_us: int, pid: int) -> None:
        _SLOT.pack_into(self._map, slot * _SLOT.size, in_flight, finished, p99_us, pid)

    def read(self, slot: int) -> tuple[int, int, int, int]:
        values: tuple[int, int, int, int] = _SLOT.unpack_from(self._map, slot * _SLOT.size)
        return values

    def reset(self, slot: int) -> None:
        self.write(slot, 0, 0, 0, 0)
        self.write_connections(slot, 0)

    def write_connections(self, slot: int, connections: int) -> None:
        _CONNECTIONS.pack_into(self._map, _CONNECTIONS_AT + slot * _CONNECTIONS.size,
                               connections)

    def connections(self, slot: int) -> int:
        value: int = _CONNECTIONS.unpack_from(self._map, _CONNECTIONS_AT +
                                              slot * _CONNECTIONS.size)[0]
        return value

    def fewest_connections(self, besides: int) -> int | None:
        """The fewest open connections of a worker that is up and accepting, ``besides`` this
        slot (None: no other). Called on an accept, not per request."""
        views = self._views
        if views is None:
            # numpy here, not at import: the supervisor imports this module before ``serve``
            # sets OPENBLAS_NUM_THREADS, which numpy's BLAS reads once, as it loads
            import numpy as np

            views = self._views = (
                np.frombuffer(self._map, dtype="<i8", count=4 * MAX_SLOTS)[3::4],
                np.frombuffer(self._map, dtype="<i8", count=MAX_SLOTS, offset=_CONNECTIONS_AT))
        pids, counts = views
        others = (pids != 0) & (counts >= 0)
        others[besides] = False
        return int(counts[others].min()) if others.any() else None


class LoadMeter:
    """A worker's in-flight requests and recent latency (both transports), written to its slot."""

    def __init__(self, board: LoadBoard, slot: int, window: int = 512) -> None:
        self.board = board
        self.slot = slot
        self.in_flight = 0
        self.finished = 0
        self._recent: list[int] = []
        self._window = window
        self._p99_us = 0
        self._pid = os.getpid()
        self._published = 0.0

    def begin(self) -> int:
        """A request arrived; returns its start time for :meth:`end`."""
        self.in_flight += 1
        self._publish()
        return _now_ns()

    def end(self, start_ns: int) -> None:
        self.in_flight -= 1
        self.finished += 1
        recent = self._recent
        recent.append(_now_ns() - start_ns)
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


class AsgiMeter:
    """ASGI wrapper: every HTTP request is metered from its first byte to its last, those of
    the HTTP protocol's inline lane too (``serving/http_protocol.py``)."""

    def __init__(self, app: InlineApp, meter: LoadMeter) -> None:
        self.app = app
        self.meter = meter

    def infer_inline(self, path: str, headers: Headers, body: bytes,
                     respond: Responder) -> Asgi | None:
        meter = self.meter
        start = meter.begin()
        try:
            later = self.app.infer_inline(path, headers, body, respond)
        except BaseException:
            meter.end(start)
            raise
        if later is None:
            meter.end(start)
            return None

        async def rest(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                await later(scope, receive, send)
            finally:
                meter.end(start)

        return rest

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = self.meter.begin()
        try:
            await self.app(scope, receive, send)
        finally:
            self.meter.end(start)


class GrpcMeter(grpc.aio.ServerInterceptor):
    """gRPC server interceptor: every unary call (V2 ``ModelInfer``, ``/v1`` ``Predict``, the
    health and metadata calls) is metered like a REST request. Wrapped handlers are made once
    per method and kept, so a call pays one dictionary lookup and one await."""

    def __init__(self, meter: LoadMeter) -> None:
        self.meter = meter
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails],
                                     Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method  # type: ignore[attr-defined]
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # unknown method (UNIMPLEMENTED) or a stream: passed through
        inner = handler.unary_unary
        meter = self.meter

        async def metered(request: Any, context: Any) -> Any:
            start = meter.begin()
            try:
                return await inner(request, context)
            finally:
                meter.end(start)

        wrapped = self._wrapped[method] = handler._replace(unary_unary=metered)  # type: ignore[attr-defined]
        return wrapped
