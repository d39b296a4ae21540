"""The V2 infer path over REST: ``POST /v2/models/{name}[/versions/{v}]/infer``.

A request arrives one of two ways -- through the REST app's ASGI entry, or whole and small from
the HTTP parser's callback (``RestApp.infer_inline``: the inline lane of ``http_protocol.py``, no
ASGI scope or task) -- and then takes one path, these steps:

- **parse** (:meth:`~V2Infer.prologue`): one pass over the headers, the model and version from
  the path, the declared body within ``server.max_body_bytes``;
- **run** (:meth:`~V2Infer.start`): decode -- the common JSON shape straight to a checked array
  (``fastjson.py``), anything else through the general codec (``protocol.py``) -- the budget,
  then ``ModelHandle.infer_now``; when the model cannot run at once, the request waits in its
  batcher (``ModelHandle.infer_queued``, :meth:`~V2Infer.finish`);
- **answer**: encode, or the error's answer (:meth:`~V2Infer.failed`: the one error mapping);
  while someone observes, monitoring is one call at the end (``request_end.V2End``).

Why the fast decoder is tried first: at one row a request, the general decoder, the model's
input check and the general encoder cost more than the model run (``serving/fastjson.py``).
"""

from __future__ import annotations

from typing import Any

from redline.errors import InvalidInput, NotFound, RedlineError
from redline.serving.asgi import (
    Answer,
    Asgi,
    Headers,
    Receive,
    Scope,
    Send,
    check_size,
    error_answer,
    send_answer,
)
from redline.serving.deadline import (
    BUDGET_HEADER,
    FROM_HEADER,
    PRIORITY_HEADER,
    parse_budget,
    parse_priority,
)
from redline.serving.edge import JSON_HEADER, repeated
from redline.serving.fastjson import JsonFastPath
from redline.serving.handle import ModelHandle
from redline.serving.observers import Observers
from redline.serving.protocol import InferRequest, decode_rest, encode_rest
from redline.serving.registry import ModelRegistry
from redline.serving.request_end import V2End
from redline.serving.stages import RequestRecord, perf_ns

_OCTET = (b"content-type", b"application/octet-stream")
_HLEN = b"inference-header-content-length"
_TRACEPARENT = b"traceparent"
# The headers the infer path reads, by their place in its one loop over the headers.
_HEADERS = {b"content-length": 0, _HLEN: 1, BUDGET_HEADER: 2, PRIORITY_HEADER: 3,
            _TRACEPARENT: 4}
# What the prologue found: model, version, binary header length, budget, priority, traceparent.
Head = tuple[str, str | None, int | None, bytes | None, Any, str | None]


class Queued:
    """A request decoded and admitted whose model run waits in its version's batcher."""

    __slots__ = ("path", "handle", "inputs", "rows", "deadline", "level", "fast", "rid",
                 "request", "record")

    def __init__(self, path: str, handle: ModelHandle, inputs: dict[str, Any], rows: int,
                 deadline: float, level: int, fast: JsonFastPath | None, rid: str | None,
                 request: InferRequest | None, record: RequestRecord | None) -> None:
        self.path, self.handle, self.inputs, self.rows = path, handle, inputs, rows
        self.deadline, self.level = deadline, level
        self.fast, self.rid, self.request = fast, rid, request
        self.record = record  # the request's record when someone observes


class V2Infer:
    """The V2 infer path of one REST app (module doc)."""

    __slots__ = ("registry", "max_body", "observers", "_end")

    def __init__(self, registry: ModelRegistry, max_body: int, observers: Observers) -> None:
        self.registry = registry
        self.max_body = max_body
        self.observers = observers  # when empty, the path records nothing and costs nothing
        self._end = V2End(observers, "rest")

    def later(self, queued: Queued) -> Asgi:
        """The ASGI app that finishes a queued request of the inline lane (decoded already:
        ``receive`` is not called)."""

        async def finish(scope: Scope, receive: Receive, send: Send) -> None:
            await send_answer(send, *await self.finish(queued))

        return finish

    # ------------------------------------------------------------------ parse, run, answer
    def prologue(self, path: str, headers: Headers) -> Head:
        """What the path and headers say, in one pass; a budget or ``traceparent`` sent twice,
        a bad route or a declared body over the limit is refused here."""
        declared = header_length = budget = priority = traceparent = None
        for key, value in headers:
            which = _HEADERS.get(key)
            if which is None:
                continue
            if which == 0:  # content-length (uvicorn refused a malformed one)
                declared = int(value) if value.isdigit() else None
            elif which == 1:  # the binary extension's JSON length
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
        parts = path[11:-6].split("/")  # between "/v2/models/" and "/infer"
        if len(parts) == 1:
            name, version = parts[0], None
        elif len(parts) == 3 and parts[1] == "versions":
            name, version = parts[0], parts[2]
        else:
            raise NotFound(f"no route for POST {path}")
        if declared is not None:
            check_size(declared, self.max_body)
        return (name, version, header_length, budget, priority,
                None if traceparent is None else traceparent.decode("latin-1"))

    def start(self, path: str, head: Head, body: bytes, start_ns: int) -> Answer | Queued:
        """Decode, admit and, when the model can run at once, run and encode one request; a
        :class:`Queued` when it has to wait for its model."""
        name, version, header_length, budget, priority, traceparent = head
        observed = self.observers.observed
        handle: ModelHandle | None = None
        request: InferRequest | None = None
        rid: str | None = None
        record: RequestRecord | None = None
        rows = decoded_ns = 0
        try:
            fast = None
            if header_length is None:
                try:
                    handle = self.registry.get(name, version)
                    fast = handle.json_fast
                except RedlineError:
                    pass  # reported below, after any error in the body
            decoded = fast.decode(body) if fast is not None else None
            if decoded is not None:  # the common request, checked as it was decoded
                assert handle is not None
                inputs, rows, rid = decoded
                checked = parse_budget(budget, FROM_HEADER, default_ms=handle.slo_ms,
                                       start=start_ns * 1e-9)
                level = parse_priority(priority)
            else:
                fast = None
                request = decode_rest(body, header_length)
                rid = request.id
                if handle is None:
                    handle = self.registry.get(name, version)
                if request.outputs:
                    handle.check_outputs(request.outputs)
                checked = parse_budget(budget, FROM_HEADER, default_ms=handle.slo_ms,
                                       start=start_ns * 1e-9)
                if priority is None and request.parameters:
                    priority = request.parameters.get("priority")
                level = parse_priority(priority)
                inputs, rows = handle.prepare(request.inputs, request.datatypes)
            if observed:
                decoded_ns = perf_ns()
                if handle.steps_on_record:  # a graph: its steps are timed on the record
                    record = self._end.record(handle, rid or "", traceparent, rows, start_ns,
                                              decoded_ns)
            outputs = handle.infer_now(inputs, rows, record, checked.deadline)
            if outputs is None:  # the batcher is busy or the run is long: it queues
                if observed and record is None:
                    record = self._end.record(handle, rid or "", traceparent, rows, start_ns,
                                              decoded_ns)
                return Queued(path, handle, inputs, rows, checked.deadline, level, fast, rid,
                              request, record)
            inferred_ns = perf_ns() if observed else 0
            answer = _encode(handle, outputs, fast, request, rid)
        except Exception as exc:  # noqa: BLE001 - the one error mapping
            if not rows and request is not None:
                rows = request.rows  # a request refused by the checks counts what it sent
            return self.failed(exc, path, start_ns, traceparent, handle, rid or "", rows,
                               decoded_ns, record)
        if not observed:
            return answer
        traced = self._end.answered(handle, rid or "", traceparent, rows, inputs, outputs,
                                    start_ns, decoded_ns, inferred_ns, perf_ns(), record)
        return answer if traced is None else _traced(answer, traced)

    async def finish(self, q: Queued) -> Answer:
        """A queued request, once its batch has run: encoded, or its error's answer."""
        record = q.record
        try:
            outputs = await q.handle.infer_queued(q.inputs, q.rows, q.deadline, q.level, record)
            inferred_ns = perf_ns()
            answer = _encode(q.handle, outputs, q.fast, q.request, q.rid)
        except Exception as exc:  # noqa: BLE001 - the one error mapping
            if record is None:  # (nobody observed it when it queued)
                return error_answer(exc, "POST", q.path)[0]
            return self.failed(exc, q.path, record.start_ns, record.traceparent, record=record)
        if record is None:
            return answer
        traced = self._end.answered(q.handle, record.request_id, record.traceparent, q.rows,
                                    q.inputs, outputs, record.start_ns, 0, inferred_ns,
                                    perf_ns(), record)
        return answer if traced is None else _traced(answer, traced)

    def failed(self, exc: Exception, path: str, start_ns: int, traceparent: str | None,
               handle: ModelHandle | None = None, rid: str = "", rows: int = 0,
               decoded_ns: int = 0, record: RequestRecord | None = None) -> Answer:
        """The answer to a request that raised ``exc`` (``asgi.error_answer``), its monitoring
        ended with the error's code (on ``record`` when it queued, else on what was known)."""
        answer, code = error_answer(exc, "POST", path)
        if record is None and not self.observers.observed:
            return answer
        traced = self._end.failed(code, start_ns, traceparent, handle, rid, rows, decoded_ns,
                                  record)
        return answer if traced is None else _traced(answer, traced)


def _encode(handle: ModelHandle, outputs: dict[str, Any], fast: JsonFastPath | None,
            request: InferRequest | None, rid: str | None) -> Answer:
    """The answer's body: the fast encoder for a request it decoded, else the general one."""
    if fast is not None:
        payload = fast.encode(outputs, rid)
        if payload is not None:
            return 200, payload, [JSON_HEADER]
        request = InferRequest({}, {})  # the model returned an undeclared dtype: general
        request.id = rid
    assert request is not None
    outputs = handle.select_outputs(outputs, request.outputs)
    payload, json_length = encode_rest(handle.name, handle.version_str, outputs, request)
    if json_length is None:
        return 200, payload, [JSON_HEADER]
    return 200, payload, [_OCTET, (_HLEN, b"%d" % json_length)]


def _traced(answer: Answer, traceparent: str) -> Answer:
    """``answer`` naming the trace that tracing kept the request in."""
    status, body, headers = answer
    return status, body, [*headers, (_TRACEPARENT, traceparent.encode())]


def sent_traceparent(headers: Headers) -> str | None:
    """The caller's ``traceparent`` when sent once (for a request refused before its headers
    were read)."""
    sent = [value for key, value in headers if key == _TRACEPARENT]
    return sent[0].decode("latin-1") if len(sent) == 1 else None
