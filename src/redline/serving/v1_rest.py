"""The REST edge of ``/v1``: JSON in, :class:`PredictRequest` and :class:`Budget` out, JSON back.

``POST /v1/models/{name}[/versions/{version}]/predict``, ``GET /v1/pipeline/stats`` and, with
feature definitions and a store, ``POST /v1/events`` (embedded ingest) are mounted on the REST
app with its public :meth:`RestApp.add_route`. The budget is the body's ``budget_ms``, else the
``x-redline-budget-ms`` header, else the model's SLO, validated by ``deadline.parse_budget``.
"""

from __future__ import annotations

import orjson

from redline.errors import RedlineError
from redline.serving.app import HttpRequest, HttpResponse, RestApp
from redline.serving.deadline import BUDGET_HEADER, FROM_BODY, FROM_HEADER, Budget, parse_budget
from redline.serving.edge import JSON_HEADER, as_redline_error, http_error
from redline.serving.handle import ModelHandle
from redline.serving.predict import PredictPipeline, parse_request
from redline.serving.stages import FlatTimes, RequestRecord, v1_times

_OPT = orjson.OPT_SERIALIZE_NUMPY
_JSON = JSON_HEADER
TRACEPARENT = b"traceparent"


class V1Rest:
    """The ``/v1`` route handlers over one pipeline."""

    def __init__(self, pipeline: PredictPipeline, app: RestApp) -> None:
        self.pipeline = pipeline
        self.observers = app.observers
        # Common requests leave their stage times, not their records (serving/stages.py):
        # the records' fold was half of monitoring's CPU a /v1 request (docs/performance.md).
        self._flat = FlatTimes(app.observers, "v1", "rest", v1_times)

    def install(self, app: RestApp) -> None:
        app.add_route("POST", "/v1/models/{name}/predict", self.predict)
        app.add_route("POST", "/v1/models/{name}/versions/{version}/predict", self.predict)
        app.add_route("GET", "/v1/pipeline/stats", self.stats)
        if self.pipeline.defs is not None and self.pipeline.store is not None:
            app.add_route("POST", "/v1/events", self.events)

    async def predict(self, request: HttpRequest) -> HttpResponse:
        record = RequestRecord("v1", "rest", int(request.start * 1e9))
        sent_traceparent = request.headers.get(TRACEPARENT)
        if sent_traceparent is not None:
            record.traceparent = sent_traceparent.decode("latin-1")
        try:
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
            doc = await self.pipeline.predict(request.params["name"], req, budget_of, record)
            body = orjson.dumps(doc, option=_OPT)
        except Exception as exc:
            error = as_redline_error(exc)
            record.finish(error.code if isinstance(error, RedlineError) else "internal")
            traceparent = self.observers.traceparent(record) if self.observers else None
            if self.observers:
                self.observers.finished(record)
            if error is not None and traceparent is not None:
                status, body, headers = http_error(error)
                return HttpResponse(status, body, [*headers, (TRACEPARENT, traceparent.encode())])
            if error is not None and error is not exc:
                raise error from None
            raise
        record.finish()
        if self.observers:
            if self._flat.keep(record):
                return HttpResponse(200, body)
            traceparent = self.observers.traceparent(record)  # tracing on: the request's trace
            self.observers.finished(record)
            if traceparent is not None:
                return HttpResponse(200, body, [_JSON, (TRACEPARENT, traceparent.encode())])
        return HttpResponse(200, body)

    async def stats(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(self.pipeline.stats())

    async def events(self, request: HttpRequest) -> HttpResponse:
        from redline.features.ingest import handle_events

        status, body = await handle_events(self.pipeline.ingestor, request.body)
        return HttpResponse(status, body)
