"""Feature reads from Redis on the event loop itself: one pipelined connection, no thread.

Why not the worker thread (``fetcher.py``'s executor): each read woke the worker thread, which
had to win the GIL from the event loop, and its answer woke the loop again through
``call_soon_threadsafe``: two wake-ups and two GIL hand-overs for a ~50 µs round trip. Here the
loop writes the command to a non-blocking socket and the reply arrives as one more readable
socket in the loop's own poll — the same way the HTTP request itself arrived. At 500 req/s
open loop it lowers the p50 by about a sixth; the p99 does not move (it is the process being
stalled while it waits, not the hop).

One connection per process, pipelined: commands are answered in the order they were sent, so a
FIFO of callbacks joins each reply to its call. ``timeout_s`` plays the part of redis-py's socket
timeout: when the oldest unanswered command is older than that, every pending command fails with
:class:`StoreUnavailable` and the connection is dropped (the next call reconnects), so a hung
Redis ends calls and the circuit breaker sees it. Only plain ``redis://`` URLs are read this way
(TLS, unix sockets and Redis Cluster keep the thread path).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import hiredis
from redis.connection import parse_url

from redline.errors import StoreUnavailable

Done = Callable[[Any, BaseException | None], None]


def supports(url: str) -> bool:
    """Whether ``url`` can be read on the loop (plain TCP ``redis://``)."""
    return urlsplit(url).scheme == "redis"


def encode(args: Sequence[Any]) -> bytes:
    """One command in RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _Connection(asyncio.Protocol):
    """One TCP connection; its events go to the client only while it is the client's current one."""

    def __init__(self, client: LoopRedis) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport; they offer its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.client._conn is self:
            self.client._received(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client._conn is self:
            self.client._fail(self.client._error(
                exc or ConnectionError("connection closed by the server")))


class LoopRedis:
    """A pipelined Redis connection on the running event loop (see the module doc)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        kw = parse_url(url)
        self._host = kw.get("host", "127.0.0.1")
        self._port = int(kw.get("port", 6379))
        self._hello: list[bytes] = []  # AUTH / SELECT sent first on every new connection
        if kw.get("password"):
            user = kw.get("username")
            self._hello.append(encode(["AUTH", user, kw["password"]] if user
                                      else ["AUTH", kw["password"]]))
        if int(kw.get("db", 0)):
            self._hello.append(encode(["SELECT", kw["db"]]))
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: _Connection | None = None
        self._transport: asyncio.Transport | None = None
        self._connecting = False
        self._pending: deque[tuple[float, Done]] = deque()  # sent, oldest first
        self._waiting: list[tuple[bytes, Done]] = []  # while connecting
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ calls
    def call(self, args: Sequence[Any], done: Done) -> None:
        """Send one command; ``done(reply, None)`` or ``done(None, exc)`` runs on the loop.

        An error reply is passed as ``exc`` (a ``hiredis.ReplyError``)."""
        self.send(encode(args), done)

    def send(self, payload: bytes, done: Done) -> None:
        transport = self._transport
        if transport is None:
            self._waiting.append((payload, done))
            if not self._connecting:
                self._connecting = True
                loop = self._loop = asyncio.get_running_loop()
                loop.create_task(self._connect())
            return
        transport.write(payload)
        self._pending.append((self._loop.time(), done))  # type: ignore[union-attr]
        if self._timer is None:
            self._arm()

    async def _connect(self) -> None:
        loop = self._loop
        assert loop is not None
        conn = _Connection(self)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: conn, self._host, self._port),
                max(self.timeout_s, 0.5))
        except Exception as exc:  # noqa: BLE001 - every waiting call fails with the reason
            self._connecting = False
            waiting, self._waiting = self._waiting, []
            error = self._error(exc)
            for _, done in waiting:
                done(None, error)
            return
        self._connecting = False
        self._conn, self._transport = conn, conn.transport
        waiting, self._waiting = self._waiting, []
        for payload in self._hello:
            self.send(payload, self._hello_done)
        for payload, done in waiting:
            self.send(payload, done)

    def _hello_done(self, reply: Any, exc: BaseException | None) -> None:
        if exc is not None:
            self._fail(self._error(exc))

    def _received(self, conn: _Connection, data: bytes) -> None:
        reader = conn.reader
        reader.feed(data)
        pending = self._pending
        while self._conn is conn:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self._fail(self._error(exc))
                return
            if reply is False:
                return
            if not pending:  # a reply nobody asked for: the stream is out of step
                self._fail(StoreUnavailable(f"Redis online store at {self.url} sent an "
                                            "unexpected reply; reconnecting"))
                return
            _, done = pending.popleft()
            if isinstance(reply, hiredis.ReplyError):
                done(None, reply)
            else:
                done(reply, None)

    # ------------------------------------------------------------------ failures
    def _arm(self) -> None:
        if self._pending and self._loop is not None:
            self._timer = self._loop.call_at(self._pending[0][0] + self.timeout_s, self._check)

    def _check(self) -> None:
        """Watchdog: fail everything when the oldest command waited past the timeout."""
        self._timer = None
        if not self._pending:
            return
        if self._pending[0][0] + self.timeout_s <= self._loop.time():  # type: ignore[union-attr]
            self._fail(self._error(TimeoutError(
                f"no reply within {self.timeout_s * 1e3:.0f} ms")))
        else:
            self._arm()

    def _error(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"Redis online store at {self.url} is unavailable ({type(exc).__name__}: {exc}); "
            "check that redis-server runs and features.redis_url points at it")

    def _fail(self, error: StoreUnavailable) -> None:
        """Drop the connection; every pending call fails with ``error``."""
        transport, self._transport, self._conn = self._transport, None, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, deque()
        if transport is not None:
            transport.abort()
        for _, done in pending:
            done(None, error)

    def close(self) -> None:
        self._fail(StoreUnavailable("the feature reader is closed"))


def script_read(client: LoopRedis, reader: Any) -> Any:
    """A ``FeatureFetcher`` start function: ``reader``'s one-script read sent on ``client``.

    ``reader`` is a single-Redis :class:`~redline.features.online.redis.RedisReader`; its
    ``command`` builds the script's KEYS and ARGV and its ``decode`` parses the reply, so the
    read is the same script as the thread path's. A Redis that lost its scripts (restarted)
    answers NOSCRIPT once; the read is then sent with the script body (EVAL), which loads it.
    """
    from redline.features.online.redis import RedisReader

    assert isinstance(reader, RedisReader) and not reader.store.cluster

    def start(ids: dict[str, list[str]], done: Done) -> None:
        n, keys, args = reader.command(ids)
        client.call(["EVALSHA", reader.script.sha, len(keys), *keys, *args],
                    _ScriptReply(client, reader, n, keys, args, done))

    return start


class _ScriptReply:
    """The reply callback of one script read, retried once with EVAL after NOSCRIPT.

    An object rather than a closure that names itself for the retry: such a closure is a
    reference cycle (function -> its cell -> the function), so every read's callback, with
    everything it held (keys, arguments, the fetcher's batch), lived until the garbage
    collector found it -- 13 objects a read, 20 a /v1 request (tests/pipeline/
    test_no_garbage.py) -- which set the young collections' pace and length on the /v1 path.
    Without the cycle it is freed as soon as it has run."""

    __slots__ = ("client", "reader", "n", "keys", "args", "done", "retry")

    def __init__(self, client: LoopRedis, reader: Any, n: int, keys: list[Any],
                 args: list[Any], done: Done) -> None:
        self.client, self.reader, self.n = client, reader, n
        self.keys, self.args, self.done = keys, args, done
        self.retry = True

    def __call__(self, reply: Any, exc: BaseException | None) -> None:
        done = self.done
        if exc is None:
            try:
                result = self.reader.decode_timed(reply, self.n)  # with the feature age
            except Exception as bad:  # noqa: BLE001 - a malformed reply fails this read
                done(None, bad)
                return
            done(result, None)
        elif isinstance(exc, hiredis.ReplyError):
            if self.retry and str(exc).startswith("NOSCRIPT"):
                self.retry = False
                keys = self.keys
                self.client.call(["EVAL", self.reader.script.script, len(keys), *keys,
                                  *self.args], self)
            else:
                from redis.exceptions import ResponseError

                done(None, ResponseError(str(exc)))
        else:
            done(None, exc)
