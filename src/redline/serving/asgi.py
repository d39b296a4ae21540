"""The ASGI side of the REST edge, named once: its types, a body read within the limit, an answer.

The router (``app.py``) and the V2 infer path (``v2_infer.py``) both read bodies, map errors and
write answers; they do it through these few functions, so a body limit or an error body is
decided in one place. An answer is ``(status, body, headers)``; ``content-length`` is added when
it is written.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from redline.errors import PayloadTooLarge
from redline.serving.edge import JSON_HEADER, as_redline_error, error_body, http_error

log = logging.getLogger("redline.serving")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
Answer = tuple[int, bytes, Headers]
# Writes a whole answer at once (the HTTP protocol's inline lane).
Responder = Callable[[int, bytes, Headers], None]


@runtime_checkable
class InlineApp(Protocol):
    """An ASGI app that also answers a whole small V2 infer request from the HTTP parser's
    callback (``http_protocol.py``, the inline lane): the REST app, and whatever wraps it
    (the worker's load meter, its pool guard)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...

    def infer_inline(self, path: str, headers: Headers, body: bytes,
                     respond: Responder) -> Asgi | None:
        """Answer through ``respond`` (and return None), or return the ASGI app that finishes
        the request once its model can run."""
        ...


def check_size(size: int, limit: int) -> None:
    """Refuse a body of ``size`` bytes over ``server.max_body_bytes`` (``limit``)."""
    if size > limit:
        raise PayloadTooLarge(
            f"request body of {size} bytes exceeds server.max_body_bytes ({limit}); "
            "send fewer rows per request or raise the limit")


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body (a declared length was checked already)."""
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        return body
    return await read_rest(receive, body, limit)


async def read_rest(receive: Receive, body: bytes, limit: int) -> bytes:
    """The rest of a body that arrived in several messages, ``body`` the first, within
    ``limit``."""
    chunks = [body]
    size = len(body)
    message: dict[str, Any] = {"more_body": True}
    while message.get("more_body"):
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        check_size(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def error_answer(exc: Exception, method: str, path: str) -> tuple[Answer, str]:
    """The answer to a request that raised ``exc``, and the code its record ends with.

    A :class:`~redline.errors.RedlineError` (or a client's input that is one in all but name,
    ``edge.as_redline_error``) is its status and V2 error body; anything else is a bug: logged
    with its traceback, answered 500 without one."""
    error = as_redline_error(exc)
    if error is not None:
        return http_error(error), error.code
    log.exception("unhandled error on %s %s", method, path)
    return (500, error_body(f"internal error: {type(exc).__name__}", "internal"),
            [JSON_HEADER]), "internal"


async def send_answer(send: Send, status: int, body: bytes, headers: Headers) -> None:
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [*headers, (b"content-length", b"%d" % len(body))],
    })
    await send({"type": "http.response.body", "body": body})


async def lifespan(receive: Receive, send: Send) -> None:
    """Answer ASGI lifespan messages (the server owns start-up and shutdown)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
