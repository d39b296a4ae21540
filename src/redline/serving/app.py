"""The REST app: a bare ASGI callable, its route table, and what a route handler sees.

No framework on the hot path, on purpose: FastAPI's routing, request objects and response
classes cost a large share of a one-row request against a bare ASGI callable
(``benchmarks/serving/compare.py``, ``docs/performance.md``).
``POST /v2/models/{name}[/versions/{v}]/infer`` is matched first, with two string tests, and
takes the V2 infer path's steps (``v2_infer.py``), as does a request of the HTTP protocol's
inline lane (:meth:`RestApp.infer_inline`): these two entries are the path's only callers.
Every other path goes through the route table that packages fill with
:meth:`RestApp.add_route`: the V2 metadata and health routes (``v2_routes.py``), ``/v1``
(``v1_rest.py``), monitoring's ``/metrics`` and dashboard. A route handler receives an
:class:`HttpRequest` and returns an :class:`HttpResponse`, and may run models through
``registry.get(name).infer(...)``.

Every :class:`~redline.errors.RedlineError` becomes its V2 body ``{"error": ..., "code": ...}``
with its HTTP status (``Overloaded`` adds ``Retry-After``); anything else is logged and answered
500 without a traceback (``asgi.error_answer``).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from redline.config import Settings
from redline.errors import InvalidInput, NotFound, Unauthorized
from redline.serving import openapi
from redline.serving.asgi import (
    Asgi,
    Headers,
    Receive,
    Responder,
    Scope,
    Send,
    check_size,
    error_answer,
    lifespan,
    read_body,
    read_rest,
)
from redline.serving.deadline import now
from redline.serving.edge import JSON_HEADER, error_body, http_headers
from redline.serving.observers import Observers
from redline.serving.registry import ModelRegistry
from redline.serving.stages import perf_ns
from redline.serving.v2_infer import Queued, V2Infer, sent_traceparent


@dataclass(slots=True)
class HttpRequest:
    """What a route handler sees: the parsed path parameters, lower-case headers and body."""

    method: str
    path: str
    params: dict[str, str]
    headers: dict[bytes, bytes]
    body: bytes
    start: float  # perf_counter at arrival, for budgets

    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"request body is not valid JSON ({exc})") from None


@dataclass(slots=True)
class HttpResponse:
    status: int = 200
    body: bytes = b"{}"
    headers: Headers = field(default_factory=lambda: [JSON_HEADER])

    @classmethod
    def json(cls, doc: Any, status: int = 200) -> HttpResponse:
        return cls(status, orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class _Route:
    __slots__ = ("method", "template", "parts", "handler", "admin", "openapi")

    def __init__(self, method: str, template: str, handler: Handler, admin: bool,
                 openapi: dict[str, Any] | None) -> None:
        self.method = method
        self.template = template
        self.parts = template.strip("/").split("/")
        self.handler = handler
        self.admin = admin
        self.openapi = openapi

    def match(self, parts: list[str]) -> dict[str, str] | None:
        if len(parts) != len(self.parts):
            return None
        params: dict[str, str] = {}
        for want, got in zip(self.parts, parts, strict=True):
            if want[:1] == "{":
                if not got:
                    return None
                params[want[1:-1]] = got
            elif want != got:
                return None
        return params


class RestApp:
    """The ASGI callable: the V2 infer path first, then the route table."""

    def __init__(self, registry: ModelRegistry, settings: Settings,
                 observers: Observers | None = None) -> None:
        self.settings = settings
        # Told about every finished V2 infer request (and /v1 ones, by the /v1 routes); when
        # empty, the V2 path records nothing and costs nothing extra.
        self.observers = observers if observers is not None else Observers()
        self.max_body = settings.server.max_body_bytes
        self._infer = V2Infer(registry, self.max_body, self.observers)
        self._routes: list[_Route] = []
        self.add_route("GET", "/v2/openapi.json", self._openapi)

    def add_route(
        self, method: str, template: str, handler: Handler, *, admin: bool = False,
        openapi: dict[str, Any] | None = None,
    ) -> None:
        """Serve ``method template`` (``/v1/models/{name}/predict``) with ``handler``.

        The one public way to mount routes on the REST app (``/v1`` predictions, ``/metrics``,
        a dashboard page...): ``{param}`` segments match one path segment and reach the handler
        in ``request.params``; the handler returns an :class:`HttpResponse`, and a
        ``RedlineError`` it raises is answered with its status and the V2 error body.
        ``admin=True`` routes exist only when the admin surface is enabled, behind its token.
        ``openapi`` is the route's OpenAPI operation object for ``GET /v2/openapi.json``
        (without one the route is listed with the generic error answers).
        """
        self._routes.append(_Route(method.upper(), template, handler, admin, openapi))

    # ------------------------------------------------------------------ ASGI entry
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if method == "POST" and path[-6:] == "/infer" and path[:11] == "/v2/models/":
            # Case: the hot path, the V2 infer path's steps (``v2_infer.py``).
            infer = self._infer
            start_ns = perf_ns()
            try:
                head = infer.prologue(path, scope["headers"])
                message = await receive()
                body: bytes = message.get("body", b"")
                if message.get("more_body"):
                    body = await read_rest(receive, body, self.max_body)
            except Exception as exc:  # noqa: BLE001 - answered, never raised to the server
                answer = infer.failed(exc, path, start_ns, sent_traceparent(scope["headers"]))
            else:
                started = infer.start(path, head, body, start_ns)
                answer = (await infer.finish(started) if type(started) is Queued
                          else started)  # type: ignore[assignment]
        else:
            try:
                response = await self._dispatch(scope, receive, method, path)
                answer = response.status, response.body, response.headers
            except Exception as exc:  # noqa: BLE001 - a bug must not take the connection down
                answer, _ = error_answer(exc, method, path)
        status, payload, headers = answer
        # The two sends inline, not through send_answer: one coroutine less a request.
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", b"%d" % len(payload))],
        })
        await send({"type": "http.response.body", "body": payload})

    def infer_inline(self, path: str, headers: Headers, body: bytes,
                     respond: Responder) -> Asgi | None:
        """Answer ``POST path`` (a V2 infer path) now, from the HTTP parser's callback.

        The HTTP protocol (``serving/http_protocol.py``) calls this once the whole request is
        in, with the lower-case headers and the body; ``respond(status, body, headers)`` writes
        the answer at once (and ``None`` is returned). When the model cannot run on the spot
        (its batcher is busy or the run is long) nothing is written and an ASGI app is returned
        that finishes the request from where it stopped (queued, no second decode); the protocol
        runs it as an ASGI app. The same steps, answers, errors and records as the ASGI
        entry's."""
        infer = self._infer
        start_ns = perf_ns()
        try:
            head = infer.prologue(path, headers)
        except Exception as exc:  # noqa: BLE001 - answered, never raised to the protocol
            respond(*infer.failed(exc, path, start_ns, sent_traceparent(headers)))
            return None
        answer = infer.start(path, head, body, start_ns)
        if type(answer) is Queued:
            return infer.later(answer)
        respond(*answer)  # type: ignore[misc]
        return None

    # ------------------------------------------------------------------ the route table
    async def _dispatch(
        self, scope: Scope, receive: Receive, method: str, path: str
    ) -> HttpResponse:
        parts = path.strip("/").split("/")
        allowed: list[str] = []
        admin_on = self.settings.server.admin_enabled
        for route in self._routes:
            if route.admin and not admin_on:
                continue  # with the admin API off its routes do not exist (404, not 405)
            params = route.match(parts)
            if params is None:
                continue
            if route.method != method:
                allowed.append(route.method)
                continue
            headers = http_headers(scope["headers"])
            if route.admin:
                self._check_admin(headers)
            body = b""
            if method in ("POST", "PUT"):
                declared = headers.get(b"content-length")
                if declared and declared.isdigit():
                    check_size(int(declared), self.max_body)
                body = await read_body(receive, self.max_body)
            request = HttpRequest(method, path, params, headers, body, now())
            return await route.handler(request)
        if allowed:
            return HttpResponse(
                405,
                error_body(f"{method} is not allowed on {path}; use {', '.join(allowed)}",
                           "method_not_allowed"),
                [JSON_HEADER, (b"allow", ", ".join(allowed).encode())],
            )
        return HttpResponse(404, error_body(f"no route for {method} {path}", "not_found"))

    def _check_admin(self, headers: dict[bytes, bytes]) -> None:
        server = self.settings.server
        if not server.admin_enabled:
            raise NotFound("the admin API is off; set server.admin_enabled and admin_token")
        token = server.admin_token
        given = headers.get(b"authorization", b"")
        if not token or not hmac.compare_digest(given, b"Bearer " + token.encode()):
            raise Unauthorized("admin API needs 'Authorization: Bearer <server.admin_token>'")

    async def _openapi(self, request: HttpRequest) -> HttpResponse:
        admin_on = self.settings.server.admin_enabled
        return HttpResponse.json(openapi.document(
            [(r.method, r.template, r.openapi, r.admin) for r in self._routes
             if admin_on or not r.admin]))
