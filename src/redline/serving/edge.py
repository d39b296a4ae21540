"""What both transports share at the edge: one mapping of errors, and reading request metadata.

Every :class:`~redline.errors.RedlineError` becomes, on REST, its HTTP status with the V2 error
body ``{"error": ..., "code": ...}`` and, on gRPC, its status code with the same message; an
``Overloaded`` carries ``Retry-After`` / ``x-redline-retry-after-ms`` headers on REST and
``retry-after-ms`` trailing metadata on gRPC, on every API (V2 and ``/v1``). Both transports
import this module; neither imports the other, and nothing below the edge imports either.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import orjson

from redline.errors import InvalidInput, Overloaded, RedlineError

JSON_HEADER = (b"content-type", b"application/json")
TRACEPARENT = "traceparent"
BUDGET_KEY = "x-redline-budget-ms"
PRIORITY_KEY = "x-redline-priority"
AUTHORIZATION = "authorization"
# Headers (gRPC metadata) that decide a request's access, budget or trace: sent twice they are
# ambiguous (proxies and servers disagree on which one wins), so the request is refused.
SINGLE_HEADERS = frozenset((AUTHORIZATION, BUDGET_KEY, TRACEPARENT))
_SINGLE_HTTP = frozenset(name.encode() for name in SINGLE_HEADERS)


def error_body(message: str, code: str | None = None) -> bytes:
    """The V2 error body (``{"error": ..., "code": ...}``)."""
    doc = {"error": message}
    if code:
        doc["code"] = code
    return orjson.dumps(doc)


def as_redline_error(exc: BaseException) -> RedlineError | None:
    """A client-caused failure that is not a ``RedlineError`` yet, or ``None`` (a real bug).

    JSON nested deeper than Python's recursion limit reaches the decoders as ``RecursionError``;
    it is the client's input, so it is a 400 like any other malformed body.
    """
    if isinstance(exc, RedlineError):
        return exc
    if isinstance(exc, RecursionError):
        return InvalidInput("the request is nested too deeply; send flat data")
    return None


def retry_after_ms(exc: RedlineError) -> int | None:
    """Milliseconds a client should wait before retrying (overloads only)."""
    if isinstance(exc, Overloaded):
        return max(1, round(exc.retry_after_s * 1e3))
    return None


def http_error(exc: RedlineError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """(status, body, headers) of the REST answer to ``exc``."""
    headers = [JSON_HEADER]
    millis = retry_after_ms(exc)
    if millis is not None:
        headers.append((b"retry-after", b"%d" % max(1, math.ceil(millis / 1e3))))
        headers.append((b"x-redline-retry-after-ms", b"%d" % millis))
    return exc.http_status, error_body(exc.message, exc.code), headers


def grpc_trailers(exc: RedlineError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of the gRPC answer to ``exc`` (``retry-after-ms`` on overload)."""
    millis = retry_after_ms(exc)
    return (("retry-after-ms", str(millis)),) if millis is not None else ()


async def grpc_abort(context: Any, exc: RedlineError,
                     extra: tuple[tuple[str, str], ...] = ()) -> None:
    """End a gRPC call with the status, message and trailers ``exc`` maps to (and ``extra``
    trailers, such as the request's ``traceparent``)."""
    import grpc

    trailers = grpc_trailers(exc) + extra
    if trailers:
        context.set_trailing_metadata(trailers)
    await context.abort(getattr(grpc.StatusCode, exc.grpc_status), exc.message)


def repeated(name: str) -> InvalidInput:
    """The error for a request that sends a :data:`SINGLE_HEADERS` header more than once."""
    return InvalidInput(f"the header '{name}' is sent more than once; send it once (which one "
                        "counts is ambiguous, so the request is refused)")


def http_headers(raw: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """An HTTP request's (lower-case) headers as a dict, refusing a repeated
    :data:`SINGLE_HEADERS` one (any other repeated header: the last one counts)."""
    headers = dict(raw)
    if len(headers) != len(raw):  # some header came twice: only ours matter
        seen: set[bytes] = set()
        for key, _ in raw:
            if key in seen and key in _SINGLE_HTTP:
                raise repeated(key.decode("latin-1"))
            seen.add(key)
    return headers


def grpc_metadata(context: Any, keys: Collection[str]) -> dict[str, str]:
    """The values of ``keys`` (a frozenset on hot paths) in a call's invocation metadata; a
    key of :data:`SINGLE_HEADERS` sent twice is refused (``InvalidInput``)."""
    found: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if key in keys:
            if key in found:
                if key in SINGLE_HEADERS:
                    raise repeated(key)
                continue  # first one wins
            found[key] = value if isinstance(value, str) else value.decode("latin-1")
    return found
