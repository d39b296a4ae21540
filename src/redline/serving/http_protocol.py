"""uvicorn's httptools protocol, with V2 infer requests answered from the parser's callback.

Three changes to :class:`HttpToolsProtocol`, nothing else:

- **The inline lane.** A ``POST /v2/models/.../infer`` with a ``Content-Length`` body (up to
  64 KiB, no ``Expect: 100-continue``, nothing pipelined ahead of it) is not turned into an ASGI
  request: once its body is in, the app's ``infer_inline`` decodes it, runs the model when its
  batcher is idle and the run is short (``ModelHandle.infer_now``), and the answer is written
  with one ``transport.write``. Why: a one-row request costs the model ~5 µs, while the ASGI
  plumbing around it — a scope dict, a ``RequestResponseCycle`` with its ``asyncio.Event``, a
  task, two send coroutines with their message dicts and per-header checks, two writes (two
  ``send`` system calls) — cost more than redline's own work (py-spy under c=8 load;
  ``docs/architecture.md``, "Findings that shape the hot path"). When the model cannot run on the
  spot, ``infer_inline`` returns an ASGI app that finishes the already-decoded request through the
  batcher's queue, and it runs as a normal uvicorn request (same cycle, same task, same flow
  control). Every other request — other paths and methods, chunked or large bodies, upgrades,
  pipelined requests behind an unfinished one — takes uvicorn's own path unchanged. The answers
  are the same bytes as the ASGI path's (``tests/serving/test_http_inline.py``).
- **Framing errors in the JSON body.** A request the HTTP parser refuses (a bad or duplicate
  ``Content-Length``, broken chunked encoding, an invalid header name, an unknown method) never
  reaches the app: uvicorn answers it with ``text/plain`` "Invalid HTTP request received.";
  here it gets the same ``{"error": ..., "code": ...}`` body as every other error.
- **Limits on what one client may hold** (:class:`HttpLimits`, the ``server.*`` settings):
  uvicorn bounds none of them, so one client could send a 64 MiB header (parsed on the event
  loop while every other client waited), 100,000 header fields, or one byte a second on as
  many connections as it liked. Here the request line and headers are counted as they arrive
  (431 past ``max_header_bytes`` or ``max_headers``), the head and the body must each arrive
  within their timeout (408), and a connection beyond ``max_connections`` is answered 503 and
  closed. Each refusal is a JSON error that names its setting. The timeouts cost the request
  path a clock read per phase, no timer: one sweep per server (:class:`_Sweeper`) checks every
  connection's deadline a few times per timeout. The keep-alive timeout is one more such
  deadline (``server.keep_alive_timeout_s``, from the last answer; the connection is closed
  without a word, as uvicorn does): uvicorn armed a loop timer after every answer and cancelled
  it on the next request: ~3 µs a request (uvloop, measured alone), of ~60 µs in all.

Written against uvicorn's ``HttpToolsProtocol`` internals (``url``, ``headers``, ``cycle``,
``pipeline``, ``on_response_complete``, ``RequestResponseCycle``); the tests drive each case
through real sockets, so an uvicorn release that changes them fails there, not in production.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from redline.config import ServerSettings
from redline.serving.asgi import InlineApp
from redline.serving.edge import error_body

log = logging.getLogger("redline.serving")

_BODY = error_body(
    "malformed HTTP request: the request line, a header or the body framing (Content-Length, "
    "chunked encoding) is invalid; check the client", "bad_request")
_RESPONSE = b"".join([
    b"HTTP/1.1 400 Bad Request\r\n",
    b"content-type: application/json\r\n",
    b"content-length: %d\r\n" % len(_BODY),
    b"connection: close\r\n\r\n",
    _BODY,
])
_500 = error_body("internal error", "internal")
INLINE_MAX_BODY = 65536  # larger bodies arrive in pieces: uvicorn's flow control handles them
_PREFIX = b"/v2/models/"
_SUFFIX = b"/infer"
# A connection's phase, for its deadline: waiting for (or reading) a request's line and headers,
# reading its body, neither (the app works: no deadline; or the connection idles after its last
# answer: closed at the keep-alive deadline), or refused (the answer is out; closed when the
# client reads it and leaves, or at the deadline).
_IDLE, _IN_HEAD, _IN_BODY, _REFUSED = 0, 1, 2, 3
LINGER_S = 1.0  # how long a refused connection may stay open for its client to read the answer
_UNSET = float("inf")


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold of an HTTP server (the ``server.*`` settings of that name)."""

    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    keep_alive_timeout_s: float

    @classmethod
    def of(cls, server: ServerSettings) -> HttpLimits:
        return cls(server.max_header_bytes, server.max_headers, server.header_timeout_s,
                   server.body_timeout_s, server.max_connections, server.keep_alive_timeout_s)


class _Refusal(Exception):
    """Raised from a parser callback to stop parsing a request that is over a limit."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _Sweeper:
    """One per server: a few times per timeout, closes the connections past their deadline.

    Stops when the server has no connections left (the next connection starts it again)."""

    def __init__(self, server_state: Any, loop: asyncio.AbstractEventLoop,
                 limits: HttpLimits) -> None:
        self.connections = server_state.connections
        self.loop = loop
        self.every_s = min(1.0, max(0.05, min(limits.header_timeout_s, limits.body_timeout_s,
                                              limits.keep_alive_timeout_s) / 4))
        self.handle: asyncio.TimerHandle | None = loop.call_later(self.every_s, self.sweep)

    def sweep(self) -> None:
        now = self.loop.time()
        for conn in list(self.connections):  # uvicorn's set: any protocol it made
            if isinstance(conn, RedlineHttpProtocol) and conn._deadline < now:
                conn.expire()
        self.handle = self.loop.call_later(self.every_s, self.sweep) if self.connections \
            else None


_SWEEPERS: weakref.WeakKeyDictionary[Any, _Sweeper] = weakref.WeakKeyDictionary()


class RedlineHttpProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` with the inline lane for V2 infer requests and limits on
    what one client may hold (module doc). :meth:`limited` makes the class a server uses."""

    limits: ClassVar[HttpLimits] = HttpLimits.of(ServerSettings())

    @classmethod
    def limited(cls, limits: HttpLimits) -> type[RedlineHttpProtocol]:
        """This protocol with ``limits`` (uvicorn makes each connection's protocol itself)."""
        return type(cls.__name__, (cls,), {"limits": limits})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inline = self.app.infer_inline if isinstance(self.app, InlineApp) else None
        self._fast = False  # the request being parsed takes the inline lane
        self._body = b""
        self._keep = True  # the inline request's connection stays open after the answer
        self._phase = _IDLE
        self._deadline = _UNSET  # loop time by which the phase must end
        self._head_bytes = 0  # bytes received since the last head ended (the next head's)
        self._head_size = 0  # the current head's header fields, in bytes
        self._max_head = self.limits.max_header_bytes  # (read per header field: kept here)
        self._max_fields = self.limits.max_headers

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        if len(self.connections) > limits.max_connections:
            # Over the cap: answer at once and close (nothing of this client is kept).
            transport.write(_answer(503, "overloaded", (
                f"the server has {limits.max_connections} open connections "
                "(server.max_connections); retry shortly, and keep connections alive rather "
                "than opening new ones")))
            self._phase = _REFUSED
            transport.close()
            return
        # The first request's line and headers are due within header_timeout_s of the connect.
        self._phase = _IN_HEAD
        self._deadline = self.loop.time() + limits.header_timeout_s
        sweeper = _SWEEPERS.get(self.server_state)
        if sweeper is None or sweeper.handle is None:
            _SWEEPERS[self.server_state] = _Sweeper(self.server_state, self.loop, limits)

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, with the head counted as it arrives and the limits' refusals
        phase = self._phase
        if phase == _REFUSED:
            return  # the refusal is out: what follows is not read
        if phase != _IN_BODY:
            # (a read that ends a head may carry body bytes too: the exact size is checked
            # per header field in on_header)
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Refusal):
                self._refuse(exc.__context__)
            else:
                self._malformed()
            return
        except httptools.HttpParserError:
            self._malformed()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._phase != _IN_BODY and self._head_bytes > self._max_head:
            self._refuse(self._head_too_large())  # one huge header (or URL) still arriving

    def _malformed(self) -> None:
        self.logger.warning("Invalid HTTP request received.")
        self.send_400_response("Invalid HTTP request received.")

    def _head_too_large(self) -> _Refusal:
        limit = self.limits.max_header_bytes
        return _Refusal(431, "header_too_large", (
            f"the request line and headers exceed {limit} bytes (server.max_header_bytes); "
            "send less in headers (a large cookie or token?) or raise the limit"))

    def _refuse(self, refusal: _Refusal) -> None:
        """Answer a request over a limit, close the writing side, and stop reading: the
        client reads the answer, then the connection closes (at the latest after LINGER_S)."""
        in_body, fast, cycle = self._phase == _IN_BODY, self._fast, self.cycle
        self._phase = _REFUSED
        self._deadline = self.loop.time() + LINGER_S
        self._fast = False
        self._body = b""
        transport = self.transport
        if transport.is_closing():
            return
        if not fast and cycle is not None:
            if in_body and not cycle.response_started:
                # this request's app waits for the body: ours is its answer, the app's dropped
                cycle.disconnected = True
                cycle.message_event.set()
            elif in_body or not cycle.response_complete:
                # this request was answered already, or an earlier one's answer is under way
                transport.close()
                return
        transport.write(_answer(refusal.status, refusal.code, refusal.message))
        transport.pause_reading()
        if transport.can_write_eof():
            transport.write_eof()
        else:  # pragma: no cover - TCP transports can
            transport.close()

    def expire(self) -> None:
        """The sweeper's call: this connection is past its phase's deadline."""
        phase = self._phase
        self._deadline = _UNSET
        if phase == _REFUSED or self.transport.is_closing():
            self.transport.close()
            return
        if phase == _IDLE:  # (the deadline of a kept-alive connection idle since its answer)
            self.transport.close()
            return
        if self.pipeline or (phase == _IN_HEAD and self.cycle is not None
                             and not self.cycle.response_complete):
            # a pipelined request waits behind a response under way (uvicorn reads none of
            # it meanwhile): due once that is done
            self._deadline = self.loop.time() + self.limits.header_timeout_s
            return
        if phase == _IN_HEAD:
            setting, limit, what = ("server.header_timeout_s", self.limits.header_timeout_s,
                                    "request line and headers")
        else:
            setting, limit, what = ("server.body_timeout_s", self.limits.body_timeout_s,
                                    "request body")
        self._refuse(_Refusal(408, "request_timeout", (
            f"the {what} did not arrive within {limit:g} s ({setting}); send the whole "
            "request at once")))

    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive timeout as the idle phase's deadline (the sweeper's)
        # instead of a timer armed after every answer and cancelled by the next request
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._phase == _IDLE:
            self._idle_from_now()

    def _idle_from_now(self) -> None:
        """The connection waits for its next request: closed if none starts in time."""
        self._deadline = self.loop.time() + self.limits.keep_alive_timeout_s

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_RESPONSE)
        self.transport.close()

    def on_message_begin(self) -> None:
        # uvicorn builds the ASGI scope here; the inline lane needs none, so it is built in
        # on_headers_complete for the requests that take uvicorn's path.
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._fast = False
        self._head_size = 0
        if self._phase != _IN_HEAD:  # (a connection's first head is due from its connect)
            self._phase = _IN_HEAD
            self._deadline = self.loop.time() + self.limits.header_timeout_s

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's on_header, with the head's size and its number of fields bounded
        headers = self.headers
        size = self._head_size = self._head_size + len(name) + len(value) + 4
        if size + len(self.url) > self._max_head:
            raise self._head_too_large()
        if len(headers) >= self._max_fields:
            raise _Refusal(431, "header_too_large", (
                f"the request has more than {self._max_fields} header fields "
                "(server.max_headers); send fewer or raise the limit"))
        name = name.lower()
        # llhttp keeps trailing whitespace, which is not part of the value (RFC 9110, 5.5)
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        headers.append((name, value))

    def _scope(self) -> None:
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_headers_complete(self) -> None:
        self._head_bytes = 0
        self._phase = _IN_BODY  # until on_message_complete: the body is due within its timeout
        self._deadline = self.loop.time() + self.limits.body_timeout_s
        url = self.url
        if (self._inline is not None and url[-6:] == _SUFFIX and url[:11] == _PREFIX
                and not self.expect_100_continue and url.isascii() and b"%" not in url
                and (self.cycle is None or self.cycle.response_complete)
                and self.parser.get_method() == b"POST" and not self.parser.should_upgrade()):
            length = -1
            for name, value in self.headers:
                if name == b"content-length":
                    length = int(value) if value.isdigit() else -1
                    break
            if 0 <= length <= INLINE_MAX_BODY:
                self._fast = True
                self._body = b""
                self._keep = (self.parser.get_http_version() != "1.0"
                              and self.parser.should_keep_alive())
                return
        self._scope()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._fast:
            self._body = self._body + body if self._body else body
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._deadline = _UNSET
        self._head_bytes = 0
        if not self._fast:
            super().on_message_complete()
            cycle = self.cycle
            if cycle is not None and cycle.response_complete and not self.pipeline:
                self._idle_from_now()  # (answered before its body was read through)
            return
        self._fast = False
        body, self._body = self._body, b""
        path = self.url.decode("ascii")
        try:
            later = self._inline(path, self.headers, body, self._respond)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - the app maps its errors; this is a bug's last stop
            log.exception("unhandled error on POST %s", path)
            self._keep = False
            self._respond(500, _500, [(b"content-type", b"application/json")])
            return
        if later is not None:
            self._queue(later, path, body)

    def _respond(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """Write a whole inline answer at once, then what uvicorn does after a response."""
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content += (name, b": ", value, b"\r\n")
        for name, value in headers:
            content += (name, b": ", value, b"\r\n")
        content.append(b"content-length: %d\r\n" % len(body))
        if not self._keep:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", body)
        transport = self.transport
        if transport.is_closing():
            return  # the client left while its request was decoded
        transport.write(b"".join(content))
        if not self._keep:
            transport.close()
        self.on_response_complete()

    def _queue(self, app: Any, path: str, body: bytes) -> None:
        """Finish an inline request that has to wait for its model as a uvicorn request."""
        self._scope()
        scope = self.scope
        scope["method"] = "POST"
        scope["path"] = path
        scope["raw_path"] = self.url
        scope["query_string"] = b""
        cycle = RequestResponseCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=self._keep,
            on_response=self.on_response_complete,
        )
        cycle.body = bytearray(body)
        cycle.more_body = False
        self.cycle = cycle
        self._start_asgi_task(cycle, app)

    def shutdown(self) -> None:
        if self._fast:  # a request's body is still arriving: answer it, then close
            self._keep = False
            return
        super().shutdown()


def _answer(status: int, code: str, message: str) -> bytes:
    """A whole JSON error answer that closes its connection."""
    body = error_body(message, code)
    return b"".join([STATUS_LINE[status], b"content-type: application/json\r\n",
                     b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n",
                     body])
