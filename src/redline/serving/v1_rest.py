"""The REST edge of ``/v1``: JSON in, :class:`PredictRequest` and :class:`Budget` out, JSON back.

``POST /v1/models/{name}[/versions/{version}]/predict``, ``GET /v1/pipeline/stats``, a
session's item events (``POST /v1/sessions/{id}/events``, ``GET /v1/sessions/{id}``) and, with
feature definitions and a store, ``POST /v1/events`` (embedded ingest) are mounted on the REST
app with its public :meth:`RestApp.add_route`. The budget is the body's ``budget_ms``, else the
``x-redline-budget-ms`` header, else the model's SLO, validated by ``deadline.parse_budget``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from redline.serving.app import HttpRequest, HttpResponse, RestApp
from redline.serving.deadline import BUDGET_HEADER, FROM_BODY, FROM_HEADER, Budget, parse_budget
from redline.serving.edge import JSON_HEADER, as_redline_error, http_error
from redline.serving.handle import ModelHandle
from redline.serving.predict import PredictPipeline, parse_request
from redline.serving.predict.session_events import parse_session_events
from redline.serving.predict.sessions import check_session_id
from redline.serving.request_end import RequestEnd
from redline.serving.stages import RequestRecord, v1_times

_OPT = orjson.OPT_SERIALIZE_NUMPY
_JSON = JSON_HEADER
TRACEPARENT = b"traceparent"


def _traced(headers: list[tuple[bytes, bytes]],
            traceparent: str | None) -> list[tuple[bytes, bytes]]:
    return headers if traceparent is None else [*headers, (TRACEPARENT, traceparent.encode())]


class V1Rest:
    """The ``/v1`` route handlers over one pipeline."""

    def __init__(self, pipeline: PredictPipeline, app: RestApp) -> None:
        self.pipeline = pipeline
        # Common requests leave their stage times, not their records (serving/stages.py):
        # the records' fold was half of monitoring's CPU a /v1 request.
        self._end = RequestEnd(app.observers, "v1", "rest", v1_times)

    def install(self, app: RestApp) -> None:
        app.add_route("POST", "/v1/models/{name}/predict", self.predict)
        app.add_route("POST", "/v1/models/{name}/versions/{version}/predict", self.predict)
        app.add_route("GET", "/v1/pipeline/stats", self.stats)
        app.add_route("POST", "/v1/sessions/{session_id}/events", self.session_events)
        app.add_route("GET", "/v1/sessions/{session_id}", self.session)
        if self.pipeline.defs is not None and self.pipeline.store is not None:
            app.add_route("POST", "/v1/events", self.events)

    async def predict(self, request: HttpRequest) -> HttpResponse:
        record = RequestRecord("v1", "rest", int(request.start * 1e9))
        try:
            doc = await self._predict(request, record)
            body = orjson.dumps(doc, option=_OPT)
        except Exception as exc:
            error = as_redline_error(exc)
            traceparent = self._end.finish(record, error.code if error is not None
                                           else "internal")
            if error is None:
                raise  # the app logs it and answers 500
            status, body, headers = http_error(error)
            return HttpResponse(status, body, _traced(headers, traceparent))
        traceparent = self._end.finish(record)
        return HttpResponse(200, body, _traced([_JSON], traceparent))

    async def _predict(self, request: HttpRequest, record: RequestRecord) -> dict[str, Any]:
        """Parse, then run: the answer's document."""
        sent_traceparent = request.headers.get(TRACEPARENT)
        if sent_traceparent is not None:
            record.traceparent = sent_traceparent.decode("latin-1")
        req = parse_request(request.json(), self.pipeline.max_instances)
        version = request.params.get("version")
        if version is not None:
            req.version = version
        record.request_id = req.request_id or ""
        if req.budget_ms is not None:
            sent, source = req.budget_ms, FROM_BODY
        else:
            sent, source = request.headers.get(BUDGET_HEADER), FROM_HEADER
        start = request.start

        def budget_of(handle: ModelHandle) -> Budget:
            return parse_budget(sent, source, default_ms=handle.slo_ms, start=start)

        if sent is not None:  # a bad budget is a 400 even for an unknown model
            parse_budget(sent, source, default_ms=1.0, start=start)
        return await self.pipeline.predict(request.params["name"], req, budget_of, record)

    async def stats(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(self.pipeline.stats())

    async def session_events(self, request: HttpRequest) -> HttpResponse:
        """Append item events to a session; the answer is the session after them."""
        session_id = check_session_id(request.params["session_id"])
        items = parse_session_events(request.json())
        # a thread: a slow store must not stall the event loop's other requests
        state = await asyncio.to_thread(self.pipeline.add_session_events, session_id, items)
        return HttpResponse.json({"accepted": len(items), "session": state.to_dict()})

    async def session(self, request: HttpRequest) -> HttpResponse:
        """A session's items, most recent first (empty for an unknown or expired session)."""
        session_id = check_session_id(request.params["session_id"])
        items = await asyncio.to_thread(self.pipeline.sessions.items, session_id, None, True)
        return HttpResponse.json({"id": session_id, "items": [i.to_dict() for i in items]})

    async def events(self, request: HttpRequest) -> HttpResponse:
        from redline.features.ingest import handle_events

        status, body = await handle_events(self.pipeline.event_push, request.body)
        return HttpResponse(status, body)
