"""uvicorn's httptools protocol, with V2 infer requests answered from the parser's callback.

Two changes to :class:`HttpToolsProtocol`, nothing else:

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

Written against uvicorn's ``HttpToolsProtocol`` internals (``url``, ``headers``, ``cycle``,
``pipeline``, ``on_response_complete``, ``RequestResponseCycle``); the tests drive each case
through real sockets, so an uvicorn release that changes them fails there, not in production.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

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


class RedlineHttpProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` with the inline lane for V2 infer requests (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inline = getattr(self.app, "infer_inline", None)
        self._fast = False  # the request being parsed takes the inline lane
        self._body = b""
        self._keep = True  # the inline request's connection stays open after the answer

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
        if not self._fast:
            super().on_message_complete()
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


JsonErrorHttpProtocol = RedlineHttpProtocol  # the name this class had before the inline lane
