"""TensorFlow Serving's REST API (and KServe's V1 protocol, which copies its predict call).

``POST /v1/models/{name}[/versions/{v}|/labels/{alias}]:predict`` with the row (``instances``)
or columnar (``inputs``) body, answered ``{"predictions": ...}`` or ``{"outputs": ...}``;
``GET /v1/models/{name}[/versions/{v}|/labels/{alias}]`` (``model_version_status``) and
``.../metadata`` (``model_spec`` and ``signature_def``); ``GET /v1/models`` (KServe's list).
Errors are TF Serving's ``{"error": "<message>"}`` with redline's status and message (its
stable code in the ``x-redline-error-code`` header). The bodies' conversion to and from
arrays is ``tfserving_codec``.

Which path a ``:predict`` request takes (``docs/protocol.md``):

- **tensors**: the model's inputs (a row per instance; named inputs as objects) go through the
  same handle, budget, batcher and monitoring call as V2 infer (``request_end.V2End``);
- **entities**: for a model that records ``feature_names`` (a ``/v1`` model), instances that are
  objects whose keys are not all input names are ``/v1`` rows -- keys that are the model's entity
  keys become ``entities``, the others ``request`` fields -- and go through
  ``PredictPipeline.predict`` as ``/v1/models/{name}/predict`` does (features, budgets,
  fallbacks, monitoring); ``predictions`` holds each row's ``prediction``.

The router matches whole segments, so ``fraud:predict`` reaches these handlers as one path
parameter and the verb is split off here (``{target}``), not in the router.
"""

from __future__ import annotations

from typing import Any

import orjson

from redline.errors import InvalidInput, ModelNotReady, NotFound
from redline.serving.app import HttpRequest, HttpResponse, RestApp
from redline.serving.deadline import (
    BUDGET_HEADER,
    FROM_HEADER,
    PRIORITY_HEADER,
    Budget,
    parse_budget,
    parse_priority,
)
from redline.serving.edge import JSON_HEADER, as_redline_error, http_error
from redline.serving.handle import ModelHandle
from redline.serving.predict import PredictPipeline, PredictRequest
from redline.serving.predict.request import check_count
from redline.serving.registry import ModelRegistry
from redline.serving.request_end import RequestEnd, V2End
from redline.serving.stages import RequestRecord, perf_ns, v1_times
from redline.serving.tfserving_codec import (
    SIGNATURE,
    columns_to_rows,
    encode_answer,
    input_tensors,
    is_entity_rows,
    load_body,
    payload_of,
)

_TRACEPARENT = b"traceparent"
_DT = {"BOOL": "DT_BOOL", "INT8": "DT_INT8", "INT16": "DT_INT16", "INT32": "DT_INT32",
       "INT64": "DT_INT64", "UINT8": "DT_UINT8", "UINT16": "DT_UINT16", "UINT32": "DT_UINT32",
       "UINT64": "DT_UINT64", "FP16": "DT_HALF", "FP32": "DT_FLOAT", "FP64": "DT_DOUBLE",
       "BYTES": "DT_STRING"}
_ERROR_SCHEMA = {"type": "object", "required": ["error"],
                 "properties": {"error": {"type": "string"}}}


class TfServingRest:
    """The TF Serving / KServe V1 routes over the registry and the ``/v1`` pipeline."""

    def __init__(self, registry: ModelRegistry, pipeline: PredictPipeline, app: RestApp) -> None:
        self.registry = registry
        self.pipeline = pipeline
        self.observers = app.observers
        self._tensor_end = V2End(app.observers, "rest")  # the V2 infer path's one call
        self._entity_end = RequestEnd(app.observers, "v1", "rest", v1_times)  # /v1's

    def install(self, app: RestApp) -> None:
        add = app.add_route
        add("GET", "/v1/models", self.models, openapi=_op("list models (KServe V1)", [],
                                                           "{models: [name, ...]}"))
        name = _param("name")
        add("GET", "/v1/models/{target}", self.status,
            openapi=_op("model version status (TF Serving)", [_param("target")]))
        add("POST", "/v1/models/{target}", self.predict,
            openapi=_op("predict: name:predict (TF Serving, KServe V1)", [_param("target")],
                        body=True))
        for kind in ("versions", "labels"):
            prefix = f"/v1/models/{{name}}/{kind}/{{target}}"
            add("GET", prefix, self.status,
                openapi=_op(f"version status at {kind} (TF Serving)", [name, _param("target")]))
            add("POST", prefix, self.predict,
                openapi=_op(f"predict at {kind}: v:predict (TF Serving)",
                            [name, _param("target")], body=True))
        add("GET", "/v1/models/{name}/metadata", self.metadata,
            openapi=_op("model metadata (TF Serving)", [name]))
        for kind in ("versions", "labels"):
            add("GET", f"/v1/models/{{name}}/{kind}/{{version}}/metadata", self.metadata,
                openapi=_op(f"model metadata at {kind} (TF Serving)", [name, _param("version")]))

    # ------------------------------------------------------------------ GET
    async def models(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({"models": self.registry.models()})

    async def status(self, request: HttpRequest) -> HttpResponse:
        """``model_version_status``: AVAILABLE for each live version; a failed or unloaded one
        is END with its reason."""
        try:
            name, version = _name_version(request, verb=False)
            return HttpResponse.json({"model_version_status": self._status(name, version)})
        except Exception as exc:  # noqa: BLE001 - TF Serving's error body
            return _error(exc)

    def _status(self, name: str, version: str | None) -> list[dict[str, Any]]:
        if version is not None:
            try:
                handle = self.registry.get(name, version)
            except ModelNotReady as exc:
                return [_version_status(version, "END", "UNAVAILABLE", exc.message)]
            return [_version_status(handle.version_str, "AVAILABLE")]
        try:
            self.registry.get(name)
        except ModelNotReady as exc:  # known, nothing live: each version, and why
            return [_version_status(str(v), "END", "UNAVAILABLE", exc.message)
                    for v in self.registry.versions(name)]
        entries = {h.version: _version_status(h.version_str, "AVAILABLE")
                   for h in self.registry.loaded(name)}
        for (model, v), why in self.registry.failures.items():
            if model == name and v not in entries:
                entries[v] = _version_status(str(v), "END", "UNKNOWN", str(why))
        return [entries[v] for v in sorted(entries)]

    async def metadata(self, request: HttpRequest) -> HttpResponse:
        """``model_spec`` and the one signature, ``serving_default``, in TF's tensor terms."""
        try:
            handle = self.registry.get(request.params["name"], request.params.get("version"))
            signature = {"inputs": {t.name: _tensor_info(t) for t in handle.session.inputs},
                         "outputs": {t.name: _tensor_info(t) for t in handle.session.outputs},
                         "method_name": "tensorflow/serving/predict"}
            return HttpResponse.json({
                "model_spec": {"name": handle.name, "signature_name": "",
                               "version": handle.version_str},
                "metadata": {"signature_def": {"signature_def": {SIGNATURE: signature}}},
            })
        except Exception as exc:  # noqa: BLE001 - TF Serving's error body
            return _error(exc)

    # ------------------------------------------------------------------ :predict
    async def predict(self, request: HttpRequest) -> HttpResponse:
        """Parse, then the tensor or the entity path (module doc)."""
        start_ns = int(request.start * 1e9)
        sent = request.headers.get(_TRACEPARENT)
        traceparent = sent.decode("latin-1") if sent is not None else None
        try:
            name, version = _name_version(request, verb=True)
            doc, lenient = load_body(request.body)
            payload, rows_format = payload_of(doc)
            handle = self.registry.get(name, version)
        except Exception as exc:  # noqa: BLE001 - TF Serving's error body
            if self.observers.observed:
                error = as_redline_error(exc)
                self._tensor_end.failed(error.code if error is not None else "internal",
                                        start_ns, traceparent)
            return _error(exc)
        if is_entity_rows(handle, payload, rows_format):
            return await self._entities(request, name, version, handle, payload, rows_format,
                                        start_ns, traceparent)
        return await self._tensors(request, handle, payload, rows_format, lenient, start_ns,
                                   traceparent)

    async def _tensors(self, request: HttpRequest, handle: ModelHandle, payload: Any,
                       rows_format: bool, lenient: bool, start_ns: int,
                       traceparent: str | None) -> HttpResponse:
        """The model's input tensors through its handle, as V2 infer runs them."""
        observed = self.observers.observed
        record: RequestRecord | None = None
        rows = decoded_ns = 0
        try:
            inputs = input_tensors(handle, payload, rows_format, lenient)
            budget = parse_budget(request.headers.get(BUDGET_HEADER), FROM_HEADER,
                                  default_ms=handle.slo_ms, start=request.start)
            priority = parse_priority(request.headers.get(PRIORITY_HEADER))
            inputs, rows = handle.prepare(inputs)
            if observed:
                decoded_ns = perf_ns()
                if handle.steps_on_record:  # a graph: its steps are timed on the record
                    record = self._tensor_end.record(handle, "", traceparent, rows, start_ns,
                                                     decoded_ns)
            outputs = handle.infer_now(inputs, rows, record, budget.deadline)
            if outputs is None:  # the batcher is busy or the run is long: it queues
                if observed and record is None:
                    record = self._tensor_end.record(handle, "", traceparent, rows, start_ns,
                                                     decoded_ns)
                outputs = await handle.infer_queued(inputs, rows, budget.deadline, priority,
                                                    record)
            inferred_ns = perf_ns() if observed else 0
            body = orjson.dumps(encode_answer(handle, outputs, rows, rows_format))
        except Exception as exc:  # noqa: BLE001 - TF Serving's error body
            if observed or record is not None:
                error = as_redline_error(exc)
                traced = self._tensor_end.failed(error.code if error is not None else "internal",
                                                 start_ns, traceparent, handle, "", rows,
                                                 decoded_ns, record)
                return _traced(_error(exc), traced)
            return _error(exc)
        answer = HttpResponse(200, body, [JSON_HEADER, _version_header(handle.version_str)])
        if not observed:
            return answer
        return _traced(answer, self._tensor_end.answered(
            handle, "", traceparent, rows, inputs, outputs, start_ns, decoded_ns, inferred_ns,
            perf_ns(), record))

    async def _entities(self, request: HttpRequest, name: str, version: str | None,
                        handle: ModelHandle, payload: Any, rows_format: bool, start_ns: int,
                        traceparent: str | None) -> HttpResponse:
        """``/v1`` rows through the pipeline, as ``/v1/models/{name}/predict`` runs them."""
        record = RequestRecord("v1", "rest", start_ns)
        record.traceparent = traceparent
        try:
            rows = payload if rows_format else columns_to_rows(payload)
            check_count(len(rows), self.pipeline.max_instances)
            keys = self.pipeline.route(handle).keys
            entities: list[dict[str, Any]] = []
            fields: list[dict[str, Any]] = []
            for i, row in enumerate(rows):
                if not isinstance(row, dict):
                    raise InvalidInput(f"instances[{i}] must be an object of entity keys and "
                                       "request fields, like instances[0]")
                entities.append({k: v for k, v in row.items() if k in keys})
                fields.append({k: v for k, v in row.items() if k not in keys})
            req = PredictRequest(entities, fields, True, version=version)
            sent = request.headers.get(BUDGET_HEADER)
            start = request.start
            if sent is not None:  # a bad budget is a 400 even for an unknown model
                parse_budget(sent, FROM_HEADER, default_ms=1.0, start=start)

            def budget_of(served: ModelHandle) -> Budget:
                return parse_budget(sent, FROM_HEADER, default_ms=served.slo_ms, start=start)

            doc = await self.pipeline.predict(name, req, budget_of, record)
            values = [p["prediction"] for p in doc["predictions"]]
            body = orjson.dumps({"predictions" if rows_format else "outputs": values},
                                option=orjson.OPT_SERIALIZE_NUMPY)
        except Exception as exc:  # noqa: BLE001 - TF Serving's error body
            error = as_redline_error(exc)
            traced = self._entity_end.finish(record, error.code if error is not None
                                             else "internal")
            return _traced(_error(exc), traced)
        headers = [JSON_HEADER, _version_header(doc["model_version"]),
                   (b"x-redline-path", str(doc["path"]).encode())]
        if doc.get("degraded"):
            reasons = "; ".join(doc.get("degraded_reasons") or ())
            headers.append((b"x-redline-degraded", reasons.encode("ascii", "replace")))
        return _traced(HttpResponse(200, body, headers), self._entity_end.finish(record))


# ---------------------------------------------------------------------- request
def _name_version(request: HttpRequest, *, verb: bool) -> tuple[str, str | None]:
    """The model and version (a number or alias) a path names; ``verb``: it ends ``:predict``."""
    params = request.params
    target = params["target"]
    if verb:
        head, colon, action = target.rpartition(":")
        if not colon or not head:
            raise NotFound(f"no route for POST {request.path}; predictions are "
                           "POST /v1/models/{name}[/versions/{v}]:predict")
        if action != "predict":
            raise NotFound(f"':{action}' is not served; redline answers ':predict' (send "
                           "'instances' or 'inputs' to /v1/models/{name}:predict)")
        target = head
    elif ":" in target:
        raise NotFound(f"no route for GET {request.path}; send ':predict' requests with POST")
    if "name" in params:
        return params["name"], target
    return target, None


# ---------------------------------------------------------------------- answer
def _error(exc: Exception) -> HttpResponse:
    """TF Serving's error body, ``{"error": message}``, with redline's status (and
    ``Retry-After`` on overload); the stable code is in ``x-redline-error-code``."""
    error = as_redline_error(exc)
    if error is None:
        raise exc  # a bug: the app logs it and answers 500
    status, _, headers = http_error(error)
    return HttpResponse(status, orjson.dumps({"error": error.message}),
                        [*headers, (b"x-redline-error-code", error.code.encode())])


def _traced(response: HttpResponse, traceparent: str | None) -> HttpResponse:
    if traceparent is not None:
        response.headers = [*response.headers, (_TRACEPARENT, traceparent.encode())]
    return response


def _version_header(version: str) -> tuple[bytes, bytes]:
    return (b"x-redline-model-version", version.encode())


def _version_status(version: str, state: str, code: str = "OK",
                    message: str = "") -> dict[str, Any]:
    return {"version": version, "state": state,
            "status": {"error_code": code, "error_message": message}}


def _tensor_info(spec: Any) -> dict[str, Any]:
    return {"dtype": _DT.get(spec.datatype, "DT_INVALID"),
            "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in spec.shape],
                             "unknown_rank": False},
            "name": spec.name}


# ---------------------------------------------------------------------- OpenAPI
def _param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _op(summary: str, params: list[dict[str, Any]], description: str = "OK", *,
        body: bool = False) -> dict[str, Any]:
    """An operation whose errors are TF Serving's ``{"error": ...}``."""
    error = {"description": "TF Serving error body",
             "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": description,
                              "content": {"application/json": {"schema": {"type": "object"}}}},
                      **{code: error for code in
                         ("400", "404", "405", "413", "429", "503", "504")}},
    }
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"type": "object", "description": "{'instances': [...]} (rows) or "
                       "{'inputs': ...} (columns), optional 'signature_name'"}}}}
    return op

