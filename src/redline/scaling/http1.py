"""A lean keep-alive HTTP/1.1 connection pool for the client: asyncio protocols, httptools parsing.

Why not httpx: its pool scans every pooled connection on each request (``has_expired`` asks the
kernel whether each socket is readable), which cost most of a core at a few hundred requests/s
and made a client fall behind its own load for good. Here a request takes the most recently used
idle connection from a list (a connection the server closed has already said so through
``connection_lost`` and is skipped), writes one buffer and awaits one future that the parser
completes. A cancelled request (a lost hedge, a caller that gave up) closes its connection, so
the server sees the request abandoned on the wire. A request whose time ran out leaves its
connection to read the late answer and come back to the pool: under overload, when many time
out at once, closing and reconnecting each would cost the client more than the answers do.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable
from typing import Any

import httptools


class ConnectError(Exception):
    """No connection could be made: the request never left."""


class ConnectionLost(Exception):
    """The connection broke before a whole answer came back: the request may have arrived."""


# How long a timed-out request's connection waits for the late answer before it is closed: a
# server that never answers must not hold a place under the pool's cap for good.
LATE_ANSWER_WAIT_S = 2.0


class _Connection(asyncio.Protocol):
    """One TCP connection: at most one request in flight, its answer parsed as it arrives."""

    def __init__(self, drained: Callable[[_Connection], None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self.late = False  # its request timed out; the answer is still to be read
        self._drained = drained
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionLost(f"malformed response: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionLost("the server closed the connection before answering"))
        if self.late:
            self.late = False
            self._drained(self)

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        self._body = []

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        self.reusable = self._parser.should_keep_alive()
        if waiter is not None and not waiter.done():
            waiter.set_result((self._parser.get_status_code(), b"".join(self._body)))
        elif self.late:
            self.late = False  # the late answer, read and dropped: the connection is free
            self._drained(self)

    # -- the pool's side
    def send(self, data: bytes, waiter: asyncio.Future[tuple[int, bytes]]) -> None:
        assert self.transport is not None
        self.reusable = False
        self._waiter = waiter
        self.transport.write(data)

    def expire(self) -> None:
        """The request's time is up: fail it, and keep reading for its answer."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            self.late = True
            waiter.set_exception(TimeoutError())
            asyncio.get_running_loop().call_later(LATE_ANSWER_WAIT_S, self._give_up)

    def _give_up(self) -> None:
        if self.late:
            self.close()  # connection_lost hands it back to the pool, which drops it

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class ConnectionPool:
    """Keep-alive connections to one ``host:port``; at most ``max_connections`` open at once
    (a request waits for one beyond that), at most ``max_idle`` kept between requests."""

    def __init__(self, host: str, port: int, *, max_connections: int = 256,
                 max_idle: int = 64, tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.max_connections = max_connections
        self.max_idle = max_idle
        self._host_header = f"Host: {host}:{port}\r\n".encode("latin-1")
        self.opened = 0  # connections made so far
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[_Connection | None]] = \
            collections.deque()

    @classmethod
    def for_address(cls, address: str, **options: Any) -> ConnectionPool:
        """``host:port``, ``http://host:port``, ``https://host[:port]`` (TLS, verified against
        the system's trust store) or ``[v6]:port``."""
        scheme, _, rest = address.rpartition("://")
        if scheme not in ("", "http", "https"):
            raise ValueError(f"{address}: the client speaks http:// or https://")
        rest = rest.rstrip("/")
        host, sep, port = rest.rpartition(":")
        if not sep or not port.isdigit() or host.endswith(":"):
            host, port = rest, "443" if scheme == "https" else "80"
        if scheme == "https":
            options.setdefault("tls", ssl.create_default_context())
        return cls(host.strip("[]"), int(port), **options)

    async def request(self, path: str, body: bytes, headers: bytes = b"",
                      timeout_s: float | None = None) -> tuple[int, bytes]:
        """POST ``body`` to ``path``; ``headers`` are extra ``Name: value\\r\\n`` lines.
        Returns the status and the whole body. Raises :class:`ConnectError` (nothing was sent),
        :class:`ConnectionLost` (something was) or ``TimeoutError`` after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        end = None if timeout_s is None else loop.time() + timeout_s
        conn = await self._acquire(end)
        waiter: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        conn.send(b"".join((
            b"POST ", path.encode("latin-1"), b" HTTP/1.1\r\n", self._host_header, headers,
            b"Content-Type: application/json\r\nContent-Length: ", str(len(body)).encode(),
            b"\r\n\r\n", body)), waiter)
        timer = None if end is None else loop.call_at(end, conn.expire)
        try:
            answer = await waiter
        except BaseException:
            if not conn.late:  # a late one comes back by itself once its answer is read
                self._discard(conn)  # cancelled or broken: never reuse it mid-answer
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._drained(conn)
        return answer

    async def close(self) -> None:
        """Close the idle connections and refuse the waiting requests; a later request opens
        a new connection."""
        for conn in self._idle:
            conn.close()
        self._open -= len(self._idle)
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectError(f"{self.host}:{self.port}: pool closed"))

    # -- connections
    async def _acquire(self, end: float | None) -> _Connection:
        while self._idle:
            conn = self._idle.pop()  # the most recently used: warm, least likely timed out
            if not conn.closed:
                return conn
            self._open -= 1
        if self._open >= self.max_connections:
            waiter: asyncio.Future[_Connection | None] = \
                asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(end):
                    handed = await waiter
            except (asyncio.CancelledError, TimeoutError):
                if waiter.done() and not waiter.cancelled():
                    given = waiter.result()  # handed over just as this request gave up
                    if given is not None:
                        self._release(given)
                    else:
                        self._wake_one(None)
                raise
            if handed is not None:
                return handed
        self._open += 1
        self.opened += 1
        try:
            async with asyncio.timeout_at(end):
                _, conn = await asyncio.get_running_loop().create_connection(
                    lambda: _Connection(self._drained), self.host, self.port, ssl=self.tls,
                    server_hostname=self.host if self.tls else None)
        except BaseException as exc:
            self._open -= 1
            self._wake_one(None)
            if isinstance(exc, OSError):  # refused, unreachable, TLS handshake failed
                raise ConnectError(f"{self.host}:{self.port}: {exc.strerror or exc}") from None
            raise
        return conn

    def _drained(self, conn: _Connection) -> None:
        """A timed-out request's connection has read its late answer (or closed)."""
        if conn.reusable and not conn.closed and len(self._idle) < self.max_idle:
            self._release(conn)
        else:
            self._discard(conn)

    def _release(self, conn: _Connection) -> None:
        if self._wake_one(conn):
            return
        self._idle.append(conn)

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1
        self._wake_one(None)

    def _wake_one(self, conn: _Connection | None) -> bool:
        """Hand ``conn`` (or, with None, the right to open one) to the oldest live waiter."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)  # None: the waiter opens its own, counted then
                return True
        return False
