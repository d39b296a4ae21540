"""uvicorn's httptools protocol, answering HTTP framing errors in the V2 JSON error body.

A request the HTTP parser refuses (a bad or duplicate ``Content-Length``, broken chunked
encoding, an invalid header name, an unknown method) never reaches the app: uvicorn answers it
itself with ``text/plain`` "Invalid HTTP request received.". This subclass overrides only that
answer, so clients get the same ``{"error": ..., "code": ...}`` body as for every other error.
It runs only on the error path (one method override): a well-formed request costs nothing more
(measured in ``docs/performance.md``, ``ab_cpu.py``).
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from redline.serving.edge import error_body

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


class JsonErrorHttpProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` whose parser-error answer is the JSON error body."""

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_RESPONSE)
        self.transport.close()
