"""The REST app: Open Inference Protocol v2 as a bare ASGI callable.

No framework on the hot path, on purpose: measured against a bare ASGI callable on uvicorn,
FastAPI's routing, request objects and response classes cost about 25% of a one-row request.
``POST /v2/models/{name}[/versions/{v}]/infer`` is matched first with two string tests; every
other path goes through a small table. Other packages add their own routes (``/v1/...``) with
:meth:`RestApp.add_route`; a route handler receives an :class:`HttpRequest` and returns an
:class:`HttpResponse`, and may run models through ``app.registry.get(name).infer(...)``.

Every :class:`~redline.errors.RedlineError` becomes its V2 body ``{"error": ..., "code": ...}``
with its HTTP status (``Overloaded`` adds ``Retry-After``); anything else is logged and answered
500 without a traceback.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from redline import __version__
from redline.config import Settings
from redline.errors import (
    InvalidInput,
    ModelNotReady,
    NotFound,
    PayloadTooLarge,
    RedlineError,
    Unauthorized,
)
from redline.serving import openapi
from redline.serving.deadline import (
    BUDGET_HEADER,
    FROM_HEADER,
    PRIORITY_HEADER,
    now,
    parse_budget,
    parse_priority,
)
from redline.serving.edge import (
    as_redline_error,
    error_body,
    http_error,
    http_headers,
    repeated,
)
from redline.serving.fastjson import JsonFastPath
from redline.serving.handle import ModelHandle
from redline.serving.metadata import EXTENSIONS, model_metadata, triton_config
from redline.serving.protocol import InferRequest, decode_rest, encode_rest
from redline.serving.registry import ModelRegistry
from redline.serving.stages import (
    DECODE,
    ENCODE,
    INFERENCE,
    Observers,
    RequestEnd,
    RequestRecord,
    perf_ns,
)

log = logging.getLogger("redline.serving")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

_TRACEPARENT = b"traceparent"
_NOT_LEAN = object()  # _infer_lean did nothing: the general path answers the request
_JSON = (b"content-type", b"application/json")
_OCTET = (b"content-type", b"application/octet-stream")
_HLEN = b"inference-header-content-length"
# Headers the infer path reads, by position in its header loop.
_INFER_HEADERS = {b"content-length": 0, _HLEN: 1, BUDGET_HEADER: 2, PRIORITY_HEADER: 3,
                  b"traceparent": 4}


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
    headers: list[tuple[bytes, bytes]] = field(default_factory=lambda: [_JSON])

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
    """The ASGI callable. ``draining`` turns readiness off during shutdown."""

    def __init__(self, registry: ModelRegistry, settings: Settings,
                 observers: Observers | None = None) -> None:
        self.registry = registry
        self.settings = settings
        # Told about every finished V2 infer request (and /v1 ones, by the /v1 routes); when
        # empty, the V2 path records nothing and costs nothing extra.
        self.observers = observers if observers is not None else Observers()
        self._end = RequestEnd(self.observers, "v2", "rest")  # a recorded request's last call
        self.max_body = settings.server.max_body_bytes
        self.draining = False
        self._routes: list[_Route] = []
        self._install_v2_routes()

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
                await _lifespan(receive, send)
            return
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            if method == "POST" and path[-6:] == "/infer" and path[:11] == "/v2/models/":
                # Case: the hot path (recorded stage by stage only when someone observes).
                if self.observers:
                    return await self._observed_infer(scope, receive, send, path)
                status, body, headers = await self._infer(scope, receive, path, None)
            else:
                response = await self._dispatch(scope, receive, method, path)
                status, body, headers = response.status, response.body, response.headers
        except Exception as exc:  # noqa: BLE001 - a bug must not take the connection down
            status, body, headers = self._error_answer(exc, method, path)
        # The two sends inline, not through _send: one coroutine less per request (hot path).
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", b"%d" % len(body))],
        })
        await send({"type": "http.response.body", "body": body})

    async def _read_body(self, receive: Receive, declared: int | None) -> bytes:
        if declared is not None and declared > self.max_body:
            raise PayloadTooLarge(self._too_large(declared))
        message = await receive()
        body: bytes = message.get("body", b"")
        if not message.get("more_body"):
            return body
        return await self._read_rest(receive, body)

    async def _read_rest(self, receive: Receive, body: bytes) -> bytes:
        """The rest of a body that arrived in several messages, within ``max_body_bytes``."""
        chunks = [body]
        size = len(body)
        message: dict[str, Any] = {"more_body": True}
        while message.get("more_body"):
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise PayloadTooLarge(self._too_large(size))
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, size: int) -> str:
        return (
            f"request body of {size} bytes exceeds server.max_body_bytes ({self.max_body}); "
            "send fewer rows per request or raise the limit"
        )

    # ------------------------------------------------------------------ inference
    async def _observed_infer(self, scope: Scope, receive: Receive, send: Send,
                              path: str) -> None:
        """The infer path with a :class:`RequestRecord`, handed to the observers at the end."""
        record = RequestRecord("v2", "rest")
        try:
            answer = self._ended(record, await self._infer(scope, receive, path, record))
        except Exception as exc:  # noqa: BLE001 - mapped as in __call__
            answer = self._failed(exc, path, record)
        await self._send(send, *answer)

    def _failed(self, exc: Exception, path: str,
                record: RequestRecord) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """The answer to a failed observed request, its record ended with the error code."""
        error = as_redline_error(exc)  # the code from the error, not parsed back from the body
        return self._ended(record, self._error_answer(exc, "POST", path),
                           error.code if error is not None else "internal")

    def _ended(self, record: RequestRecord, answer: tuple[int, bytes, list[tuple[bytes, bytes]]],
               status: str = "ok", end_ns: int | None = None,
               ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """``answer`` once ``record`` ended (``RequestEnd``), with the trace it names."""
        traceparent = self._end.finish(record, status, end_ns)
        if traceparent is None:
            return answer
        code, body, headers = answer
        return code, body, [*headers, (_TRACEPARENT, traceparent.encode())]

    def _error_answer(self, exc: Exception, method: str,
                      path: str) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        error = as_redline_error(exc)
        if error is not None:
            return http_error(error)
        log.exception("unhandled error on %s %s", method, path)
        return 500, error_body(f"internal error: {type(exc).__name__}", "internal"), [_JSON]

    @staticmethod
    async def _send(send: Send, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]]) -> None:
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", b"%d" % len(body))],
        })
        await send({"type": "http.response.body", "body": body})

    async def _infer(
        self, scope: Scope, receive: Receive, path: str, record: RequestRecord | None
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        start = now()
        head = _infer_headers(scope["headers"])
        if record is not None and head[4] is not None:
            record.traceparent = head[4].decode("latin-1")
        name, version = _infer_route(path)
        declared = head[0]
        if declared is not None and declared > self.max_body:
            raise PayloadTooLarge(self._too_large(declared))
        message = await receive()
        body = message.get("body", b"")
        if message.get("more_body"):
            body = await self._read_rest(receive, body)
        answer = self._infer_body(name, version, head, body, record, start)
        if type(answer) is _Queued:
            return await self._infer_queued(answer)
        return answer  # type: ignore[return-value]

    def infer_inline(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                     respond: Responder) -> Asgi | None:
        """Answer ``POST path`` (a V2 infer path) now, from the HTTP parser's callback.

        The HTTP protocol (``serving/http_protocol.py``) calls this once the whole request is
        in, with the lower-case headers and the body; ``respond(status, body, headers)`` writes
        the answer at once (and ``None`` is returned). When the model cannot run on the spot
        (its batcher is busy or the run is long) nothing is written and an ASGI app is returned
        that finishes the request from where it stopped (queued, no second decode); the protocol
        runs it as an ASGI app. Same answers, errors and records as the ASGI path.
        """
        start_ns = perf_ns()
        observers = self.observers
        if observers.stage_times is not None:  # monitored by the monitor alone: records only
            answered = self._infer_lean(path, headers, body, respond, start_ns)  # where needed
            if answered is not _NOT_LEAN:
                return answered  # type: ignore[return-value]
        start = start_ns / 1e9  # the deadline clock (``deadline.now``: perf_counter) in seconds
        record = RequestRecord("v2", "rest", start_ns) if observers else None
        try:
            head = _infer_headers(headers)
            if record is not None and head[4] is not None:
                record.traceparent = head[4].decode("latin-1")
            name, version = _infer_route(path)
            declared = head[0]
            if declared is not None and declared > self.max_body:
                raise PayloadTooLarge(self._too_large(declared))
            answer = self._infer_body(name, version, head, body, record, start)
        except Exception as exc:  # noqa: BLE001 - mapped as in __call__
            if record is None:
                answer = self._error_answer(exc, "POST", path)
            else:
                answer = self._failed(exc, path, record)
        else:
            if type(answer) is _Queued:
                return self._later(answer, path)
            if record is not None:
                answer = self._ended(record, answer)  # type: ignore[arg-type]
        respond(*answer)  # type: ignore[misc]
        return None

    def _infer_lean(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                    respond: Responder, t_start: int) -> Asgi | None | object:
        """``infer_inline`` for a monitored server, making a record only where one is needed.

        The common request (JSON of the common shape, no ``traceparent`` or binary header,
        answered at once and ok, not in the trace sample, not slow) leaves its stage times in the
        version's :class:`StageTimes` (a windows' sample its arrays too); any other gets the same
        :class:`RequestRecord` as before, built from the same clock reads. Returns
        ``_NOT_LEAN`` when nothing was done (an unusual request, errors included: the general
        path answers it from the start), else what ``infer_inline`` returns."""
        try:
            declared, header_length, budget, priority, traceparent = _infer_headers(headers)
            if header_length is not None or traceparent is not None:
                return _NOT_LEAN
            if declared is not None and declared > self.max_body:
                return _NOT_LEAN
            name, version = _infer_route(path)
            handle = self.registry.get(name, version)
            fast = handle.json_fast
            if fast is None or handle.shadowed:
                return _NOT_LEAN
            decoded = fast.decode(body)
            if decoded is None:
                return _NOT_LEAN
            checked = parse_budget(budget, FROM_HEADER, default_ms=handle.slo_ms,
                                   start=t_start / 1e9)
            level = parse_priority(priority)
        except Exception:  # noqa: BLE001 - the general path answers it, errors included
            return _NOT_LEAN
        inputs, rows, rid = decoded
        t_dec = perf_ns()
        try:
            outputs = handle.batcher.run_now(inputs, rows)
            if outputs is None:  # the batcher is busy: queued, timed on a record from here on
                record = _lean_record(handle, rid, rows, t_start, t_dec)
                return self._later(_Queued(handle, inputs, rows, checked.deadline, level,
                                           record, fast, rid, None), path)
            t_inf = perf_ns()
            status, payload, out = self._encode_fast(handle, fast, outputs, rid, None)
        except Exception as exc:  # noqa: BLE001 - mapped as in __call__, on a record
            record = _lean_record(handle, rid, rows, t_start, t_dec)
            respond(*self._failed(exc, path, record))
            return None
        t_end = perf_ns()
        times = handle.stage_times
        if times is None:  # the version's first such request: ask the lone observer again
            make = self.observers.stage_times  # (None if a rollout began as the registry routed)
            if make is not None:
                times = handle.stage_times = make("v2", "rest", handle.name, handle.version_str)
        keep: bool | None = None
        if times is not None:
            countdown = times.countdown - 1
            if (countdown and t_end - t_start <= times.slow_ns
                    and not (rid and handle.keep_io)):
                times.countdown = countdown
                if handle.keep_io and t_dec >= handle.io_next_ns and handle.sample_due(t_dec):
                    times.samples += (inputs, outputs)  # the windows' sample, beside its row
                times.times.extend((t_start, t_dec, t_inf, t_end, rows))
                respond(status, payload, out)
                return None
            # The head sample was drawn here (tracing keeps a slow one whatever the draw).
            keep = not countdown
            times.countdown = countdown or times.gap()
        # Traced (head sample or slow) or sampled for the windows: a record, as before.
        record = _lean_record(handle, rid, rows, t_start, t_dec)
        record.spans += ((INFERENCE, t_dec, t_inf), (ENCODE, t_inf, t_end))
        record.trace_keep = keep
        handle.keep_io_on(record, inputs, outputs, t_dec)
        respond(*self._ended(record, (status, payload, out), end_ns=t_end))
        return None

    def _later(self, queued: _Queued, path: str) -> Asgi:
        """The rest of an inline request that has to queue, as an ASGI app for this request
        only (its body is already decoded; ``receive`` is not called)."""

        async def finish(scope: Scope, receive: Receive, send: Send) -> None:
            record = queued.record
            try:
                answer = await self._infer_queued(queued)
            except Exception as exc:  # noqa: BLE001 - mapped as in __call__
                if record is None:
                    answer = self._error_answer(exc, "POST", path)
                else:
                    answer = self._failed(exc, path, record)
            else:
                if record is not None:
                    answer = self._ended(record, answer)
            await self._send(send, *answer)

        return finish

    def _infer_body(
        self, name: str, version: str | None, head: tuple[Any, ...], body: bytes,
        record: RequestRecord | None, start: float,
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | _Queued:
        """Decode, admit and (when it can run at once) run and encode one infer request;
        a :class:`_Queued` when the model's batcher has to queue it."""
        _, header_length, budget, priority, _ = head
        if header_length is None:
            # The common request (one float input, flat data) skips the general decoder, the
            # model's input check and the general encoder; anything else, errors included,
            # falls through to the general path below (serving/fastjson.py says why).
            try:
                handle = self.registry.get(name, version)
            except RedlineError:
                handle = None  # the general path reports it, after any error in the body
            fast = handle.json_fast if handle is not None else None
            decoded = fast.decode(body) if fast is not None else None
            if decoded is not None and fast is not None and handle is not None:
                inputs, rows, rid = decoded
                checked = parse_budget(budget, FROM_HEADER, default_ms=handle.slo_ms,
                                       start=start)
                level = parse_priority(priority)
                if record is not None:
                    _decoded(record, handle, rid, rows)
                outputs = handle.infer_now(inputs, rows, record)
                if outputs is None:
                    return _Queued(handle, inputs, rows, checked.deadline, level, record,
                                   fast, rid, None)
                return self._encode_fast(handle, fast, outputs, rid, record)
        request = decode_rest(body, header_length)
        handle = self.registry.get(name, version)
        if request.outputs:
            handle.check_outputs(request.outputs)
        checked = parse_budget(budget, FROM_HEADER, default_ms=handle.slo_ms, start=start)
        if priority is None and request.parameters:
            priority = request.parameters.get("priority")
        level = parse_priority(priority)
        if record is not None:
            first = next(iter(request.inputs.values()))
            _decoded(record, handle, request.id, int(first.shape[0]) if first.ndim else 1)
        inputs, rows = handle.prepare(request.inputs, request.datatypes)
        outputs = handle.infer_now(inputs, rows, record)
        if outputs is None:
            return _Queued(handle, inputs, rows, checked.deadline, level, record, None, None,
                           request)
        return self._encode_general(handle, outputs, request, record)

    async def _infer_queued(
        self, q: _Queued
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        outputs = await q.handle.infer_queued(q.inputs, q.rows, q.deadline, q.level, q.record)
        if q.request is None:
            assert q.fast is not None
            return self._encode_fast(q.handle, q.fast, outputs, q.rid, q.record)
        return self._encode_general(q.handle, outputs, q.request, q.record)

    @staticmethod
    def _encode_fast(handle: ModelHandle, fast: JsonFastPath, outputs: dict[str, Any],
                     rid: str | None, record: RequestRecord | None,
                     ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        t_enc = perf_ns()
        payload = fast.encode(outputs, rid)
        if payload is None:  # the model returned an undeclared dtype: general encoder
            request = InferRequest({}, {})
            request.id = rid
            payload, _ = encode_rest(handle.name, handle.version_str, outputs, request)
        if record is not None:
            record.spans.append((ENCODE, t_enc, perf_ns()))  # record.add, one call less
        return 200, payload, [_JSON]

    @staticmethod
    def _encode_general(handle: ModelHandle, outputs: dict[str, Any], request: InferRequest,
                        record: RequestRecord | None,
                        ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        t_enc = perf_ns()
        outputs = handle.select_outputs(outputs, request.outputs)
        payload, json_length = encode_rest(handle.name, handle.version_str, outputs, request)
        if record is not None:
            record.add(ENCODE, t_enc, perf_ns())
        if json_length is None:
            return 200, payload, [_JSON]
        return 200, payload, [_OCTET, (_HLEN, b"%d" % json_length)]

    # ------------------------------------------------------------------ table routes
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
            declared = headers.get(b"content-length")
            body = b""
            if method in ("POST", "PUT"):
                body = await self._read_body(
                    receive, int(declared) if declared and declared.isdigit() else None
                )
            request = HttpRequest(method, path, params, headers, body, now())
            return await route.handler(request)
        if allowed:
            return HttpResponse(
                405,
                error_body(f"{method} is not allowed on {path}; use {', '.join(allowed)}",
                           "method_not_allowed"),
                [_JSON, (b"allow", ", ".join(allowed).encode())],
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

    def _install_v2_routes(self) -> None:
        add = self.add_route
        add("GET", "/v2", self._server_metadata)
        add("GET", "/v2/health/live", self._live)
        add("GET", "/v2/health/ready", self._ready)
        add("GET", "/v2/openapi.json", self._openapi)
        for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            add("GET", prefix, self._model_metadata)
            add("GET", prefix + "/ready", self._model_ready)
            add("GET", prefix + "/config", self._model_config)
            add("GET", prefix + "/stats", self._model_stats)
            add("POST", prefix + "/infer", self._infer_elsewhere)
        add("POST", "/v2/repository/index", self._repo_index, admin=True)
        add("POST", "/v2/repository/models/{name}/load", self._repo_load, admin=True)
        add("POST", "/v2/repository/models/{name}/unload", self._repo_unload, admin=True)

    async def _infer_elsewhere(self, request: HttpRequest) -> HttpResponse:
        raise NotFound(f"no route for POST {request.path}")  # unreachable: the hot path has it

    async def _server_metadata(self, request: HttpRequest) -> HttpResponse:
        extensions = list(EXTENSIONS)
        if self.settings.server.admin_enabled:
            extensions.append("model_repository")
        return HttpResponse.json({"name": "redline", "version": __version__,
                                  "extensions": extensions})

    async def _openapi(self, request: HttpRequest) -> HttpResponse:
        admin_on = self.settings.server.admin_enabled
        return HttpResponse.json(openapi.document(
            [(r.method, r.template, r.openapi, r.admin) for r in self._routes
             if admin_on or not r.admin]))

    async def _live(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({"live": True})

    async def _ready(self, request: HttpRequest) -> HttpResponse:
        models_ready, not_ready = self.registry.readiness()
        ready = not self.draining and models_ready
        doc: dict[str, Any] = {"ready": ready}
        if not_ready:  # each model that does not serve, why, and what to do
            doc["models_not_ready"] = not_ready
        if self.draining:
            doc["reason"] = "draining: the server is shutting down"
        if fallbacks := self.registry.provider_fallbacks():  # asked for a GPU, serving on CPU
            doc["provider_fallback"] = fallbacks
        health = getattr(self, "health_details", None)  # serving/store_health.py, when set
        if health is not None:
            doc.update(health())
        return HttpResponse.json(doc, 200 if ready else 503)

    async def _model_metadata(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(model_metadata(self.registry, request.params))

    async def _model_ready(self, request: HttpRequest) -> HttpResponse:
        name, version = request.params["name"], request.params.get("version")
        try:
            self.registry.get(name, version)
        except ModelNotReady as exc:  # known but not loaded: 503; unknown: 404 (raised)
            return HttpResponse.json({"name": name, "ready": False, "error": exc.message}, 503)
        if self.draining:
            return HttpResponse.json({"name": name, "ready": False, "error": "draining"}, 503)
        return HttpResponse.json({"name": name, "ready": True})

    async def _model_config(self, request: HttpRequest) -> HttpResponse:
        handle = self.registry.get(request.params["name"], request.params.get("version"))
        return HttpResponse.json(triton_config(handle))

    async def _model_stats(self, request: HttpRequest) -> HttpResponse:
        handle = self.registry.get(request.params["name"], request.params.get("version"))
        return HttpResponse.json({"name": handle.name, "version": handle.version_str,
                                  "queued": handle.batcher.queued,
                                  "batch_cap": handle.batcher.cap, **handle.stats.as_dict()})

    async def _repo_index(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(self.registry.index())

    async def _repo_load(self, request: HttpRequest) -> HttpResponse:
        await self.registry.load(request.params["name"])
        return HttpResponse.json({"name": request.params["name"], "loaded": True})

    async def _repo_unload(self, request: HttpRequest) -> HttpResponse:
        await self.registry.unload(request.params["name"])
        return HttpResponse.json({"name": request.params["name"], "unloaded": True})


Responder = Callable[[int, bytes, list[tuple[bytes, bytes]]], None]


class _Queued:
    """An infer request decoded and admitted whose model run has to wait in the batcher."""

    __slots__ = ("handle", "inputs", "rows", "deadline", "level", "record", "fast", "rid",
                 "request")

    def __init__(self, handle: ModelHandle, inputs: dict[str, Any], rows: int,
                 deadline: float, level: int, record: RequestRecord | None,
                 fast: JsonFastPath | None, rid: str | None,
                 request: InferRequest | None) -> None:
        self.handle, self.inputs, self.rows = handle, inputs, rows
        self.deadline, self.level, self.record = deadline, level, record
        self.fast, self.rid, self.request = fast, rid, request


def _infer_headers(headers: list[tuple[bytes, bytes]]) -> tuple[Any, ...]:
    """(declared length, binary header length, budget, priority, traceparent) from an
    infer's headers; a budget or ``traceparent`` sent twice is refused."""
    declared = header_length = budget = priority = traceparent = None
    for key, value in headers:
        which = _INFER_HEADERS.get(key)
        if which is None:
            continue
        if which == 0:
            declared = int(value) if value.isdigit() else None
        elif which == 1:
            if not value.isdigit():
                raise InvalidInput("Inference-Header-Content-Length must be an integer")
            header_length = int(value)
        elif which == 2:
            if budget is not None:
                raise repeated("x-redline-budget-ms")
            budget = value
        elif which == 3:
            priority = value
        else:
            if traceparent is not None:
                raise repeated("traceparent")
            traceparent = value
    return declared, header_length, budget, priority, traceparent


def _infer_route(path: str) -> tuple[str, str | None]:
    """(model, version) of ``/v2/models/{name}[/versions/{v}]/infer``."""
    parts = path[11:-6].split("/")
    if len(parts) == 1:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions":
        return parts[0], parts[2]
    raise NotFound(f"no route for POST {path}")


def _lean_record(handle: ModelHandle, rid: str | None, rows: int, t_start: int,
                 t_dec: int) -> RequestRecord:
    """The record of a request ``_infer_lean`` could not leave as flat stage times."""
    record = RequestRecord("v2", "rest", t_start)
    _decoded(record, handle, rid, rows, t_dec)
    return record


def _decoded(record: RequestRecord, handle: ModelHandle, rid: str | None, rows: int,
             end_ns: int | None = None) -> None:
    record.model, record.version = handle.name, handle.version_str
    record.request_id = rid or ""
    record.rows = rows
    record.spans.append((DECODE, record.start_ns,  # record.add, one call less
                         perf_ns() if end_ns is None else end_ns))


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
