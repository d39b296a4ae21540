"""The gRPC edge of ``/v1``: ``redline.v1.PredictionService`` (``proto/redline_v1.proto``).

The protobuf request becomes a :class:`PredictRequest` directly (no JSON round trip); the
budget is the ``budget_ms`` field when non-zero, else ``x-redline-budget-ms`` metadata, else the
gRPC deadline, else the model's SLO, all through ``deadline.parse_budget``. Errors, overloads'
``retry-after-ms`` included, go through ``edge.grpc_abort`` exactly as on the V2 service.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import grpc

from redline.errors import InvalidInput, RedlineError
from redline.proto import redline_v1_pb2 as v1
from redline.serving.deadline import (
    FROM_GRPC_DEADLINE,
    FROM_GRPC_FIELD,
    FROM_METADATA,
    Budget,
    parse_budget,
)
from redline.serving.edge import (
    BUDGET_KEY,
    TRACEPARENT,
    as_redline_error,
    grpc_abort,
    grpc_metadata,
)
from redline.serving.grpc import Undecodable, lenient
from redline.serving.handle import ModelHandle
from redline.serving.observers import Observers
from redline.serving.predict import PredictPipeline, PredictRequest
from redline.serving.predict.request import check_count
from redline.serving.predict.sessions import check_session_id
from redline.serving.request_end import RequestEnd
from redline.serving.stages import RequestRecord, perf_ns, v1_times

log = logging.getLogger("redline.serving")
_METADATA_KEYS = frozenset((BUDGET_KEY, TRACEPARENT))
SERVICE = "redline.v1.PredictionService"


class V1Grpc:
    """``Predict`` over one pipeline."""

    def __init__(self, pipeline: PredictPipeline, observers: Observers) -> None:
        self.pipeline = pipeline
        # Common requests leave their stage times, not their records (serving/stages.py).
        self._end = RequestEnd(observers, "v1", "grpc", v1_times)

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        method = grpc.unary_unary_rpc_method_handler(
            self.predict,
            request_deserializer=lenient(v1.PredictRequest.FromString,  # type: ignore[attr-defined]
                                         "redline.v1.PredictRequest"),
            response_serializer=v1.PredictResponse.SerializeToString)  # type: ignore[attr-defined]
        return [grpc.method_handlers_generic_handler(SERVICE, {"Predict": method})]

    async def predict(self, request: Any, context: Any) -> Any:
        start_ns = perf_ns()
        record = RequestRecord("v1", "grpc", start_ns)
        try:
            req, budget_of = self._parse(request, context, record)
            doc = await self.pipeline.predict(request.model_name, req, budget_of, record)
            resp = _encode(doc, req.batch)
        except Exception as exc:  # noqa: BLE001 - mapped below; a bug is logged, never UNKNOWN
            error = as_redline_error(exc)
            if error is None:
                log.exception("unhandled error in redline.v1 Predict")
                error = RedlineError(f"internal error: {type(exc).__name__}")
            traceparent = self._end.finish(record, error.code)
            await grpc_abort(context, error, _trailers(traceparent))
        traceparent = self._end.finish(record)
        if traceparent is not None:
            context.set_trailing_metadata(_trailers(traceparent))
        return resp

    def _parse(self, request: Any, context: Any, record: RequestRecord
               ) -> tuple[PredictRequest, Callable[[ModelHandle], Budget]]:
        """The request and how to make its budget for the model that serves it."""
        start = record.start_ns * 1e-9
        if isinstance(request, Undecodable):
            raise InvalidInput(request.reason)
        meta = grpc_metadata(context, _METADATA_KEYS)
        record.traceparent = meta.get(TRACEPARENT)
        req = self._decode(request)
        record.request_id = req.request_id or ""
        sent: Any
        if request.budget_ms != 0:
            sent, source = request.budget_ms, FROM_GRPC_FIELD
        elif BUDGET_KEY in meta:
            sent, source = meta[BUDGET_KEY], FROM_METADATA
        else:
            remaining = context.time_remaining()
            sent = remaining * 1e3 if remaining is not None else None
            source = FROM_GRPC_DEADLINE

        def budget_of(handle: ModelHandle) -> Budget:
            return parse_budget(sent, source, default_ms=handle.slo_ms, start=start)

        if sent is not None:  # a bad budget is INVALID_ARGUMENT even for an unknown model
            parse_budget(sent, source, default_ms=1.0, start=start)
        return req, budget_of

    def _decode(self, request: Any) -> PredictRequest:
        if not request.instances:
            raise InvalidInput("a PredictRequest needs at least one instance")
        check_count(len(request.instances), self.pipeline.max_instances)
        entities, fields = [], []
        for inst in request.instances:
            entities.append(dict(inst.entities))
            row: dict[str, Any] = {}
            for name, value in inst.request.items():
                if not math.isfinite(value):
                    raise InvalidInput(f"request field '{name}' must be a finite number; list "
                                       "a missing value in null_fields")
                row[name] = value
            for name in inst.null_fields:
                row[name] = None
            fields.append(row)
        return PredictRequest(
            entities, fields, request.batch or len(entities) > 1,
            check_session_id(request.session_id) if request.session_id else None,
            request.request_id or None, None, request.model_version or None)


def _trailers(traceparent: str | None) -> tuple[tuple[str, str], ...]:
    return () if traceparent is None else ((TRACEPARENT, traceparent),)


def _encode(doc: dict[str, Any], batch: bool) -> Any:
    resp = v1.PredictResponse(  # type: ignore[attr-defined]
        model_name=doc["model_name"], model_version=doc["model_version"],
        request_id=doc.get("request_id", ""), path=doc["path"], degraded=doc["degraded"],
        degraded_reasons=doc["degraded_reasons"], timings_us=doc["timings_us"])
    if "items" in doc:  # an inference graph: items best first, no per-row predictions
        for item in doc["items"]:
            resp.items.add(item_id=item["item_id"], score=item["score"])
        resp.retrieved = doc["retrieved"]
        return resp
    for row in doc["predictions"] if batch else [doc]:
        value = row["prediction"]
        pred = resp.predictions.add(
            values=value if isinstance(value, list) else [value],
            entity_missing=row["entity_missing"])
        if "label" in row:
            pred.has_label = True
            pred.label = row["label"]
    if "session" in doc:
        s = doc["session"]
        resp.session.id = s["id"]
        resp.session.counters.update(s["counters"])
        resp.session.events = s["events"]
    return resp
