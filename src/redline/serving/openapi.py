"""The OpenAPI 3.1 document of the whole REST surface, served at ``GET /v2/openapi.json``.

The V2 paths and schemas follow KServe's published Open Inference Protocol REST schema
(``rest_predict_v2.yaml``: ``inference_request``, ``request_input``, ``tensor_data``...), plus
redline's extensions (model config and stats, the repository API, the budget and priority
headers) and ``/v1``. Routes other packages mount with ``RestApp.add_route(..., openapi=...)``
appear with the operation they describe; a route mounted without one is still listed, with the
generic error answers, so the document never hides part of the surface.
"""

from __future__ import annotations

from typing import Any

from redline import __version__

ERROR = {"$ref": "#/components/schemas/error"}
_JSON = "application/json"


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


# The error answers any operation may give (the body is always the V2 error body).
ERRORS: dict[str, Any] = {
    "400": _json(ERROR, "invalid request (the message says what and where)"),
    "401": _json(ERROR, "admin API token missing or wrong"),
    "404": _json(ERROR, "no such route, model, version or feature"),
    "405": _json(ERROR, "method not allowed on this path"),
    "409": _json(ERROR, "feature view versions differ from the model's"),
    "413": _json(ERROR, "body larger than server.max_body_bytes"),
    "429": {**_json(ERROR, "overloaded: retry after the indicated delay"), "headers": {
        "Retry-After": {"schema": {"type": "string"}},
        "x-redline-retry-after-ms": {"schema": {"type": "string"}}}},
    "503": _json(ERROR, "not ready (loading, draining, store unavailable)"),
    "504": _json(ERROR, "the request's budget ran out"),
}

_BUDGET = {"name": "x-redline-budget-ms", "in": "header", "required": False,
           "description": "latency budget in milliseconds (0 < budget <= 600000)",
           "schema": {"type": "string"}}
_PRIORITY = {"name": "x-redline-priority", "in": "header", "required": False,
             "schema": {"type": "string", "enum": ["high", "low"]}}
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
_SESSION = {"name": "session_id", "in": "path", "required": True,
            "schema": {"type": "string", "maxLength": 128}}

_OBJECT = {"type": "object"}
_ANY: dict[str, Any] = {}

SCHEMAS: dict[str, Any] = {
    # KServe rest_predict_v2.yaml
    "error": {"type": "object", "required": ["error"],
              "properties": {"error": {"type": "string"}, "code": {"type": "string"}}},
    "metadata_server_response": {
        "type": "object", "required": ["name", "version", "extensions"],
        "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                       "extensions": {"type": "array", "items": {"type": "string"}}}},
    "metadata_tensor": {
        "type": "object", "required": ["name", "datatype", "shape"],
        "properties": {"name": {"type": "string"}, "datatype": {"type": "string"},
                       "shape": {"type": "array", "items": {"type": "integer"}}}},
    "metadata_model_response": {
        "type": "object", "required": ["name", "platform"],
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"},
            "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/metadata_tensor"}},
            "outputs": {"type": "array",
                        "items": {"$ref": "#/components/schemas/metadata_tensor"}}}},
    "parameters": {"type": "object", "additionalProperties": True},
    "tensor_data": {"type": "array", "items": {"anyOf": [
        {"$ref": "#/components/schemas/tensor_data"},
        {"type": "number"}, {"type": "string"}, {"type": "boolean"}]}},
    "request_input": {
        "type": "object", "required": ["name", "shape", "datatype", "data"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "datatype": {"type": "string"},
            "parameters": {"$ref": "#/components/schemas/parameters"},
            "data": {"$ref": "#/components/schemas/tensor_data"}}},
    "request_output": {
        "type": "object", "required": ["name"],
        "properties": {"name": {"type": "string"},
                       "parameters": {"$ref": "#/components/schemas/parameters"}}},
    "inference_request": {
        "type": "object", "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {"$ref": "#/components/schemas/parameters"},
            "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/request_input"}},
            "outputs": {"type": "array",
                        "items": {"$ref": "#/components/schemas/request_output"}}}},
    "response_output": {
        "type": "object", "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "datatype": {"type": "string"},
            "parameters": {"$ref": "#/components/schemas/parameters"},
            "data": {"$ref": "#/components/schemas/tensor_data"}}},
    "inference_response": {
        "type": "object", "required": ["model_name", "outputs"],
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "parameters": {"$ref": "#/components/schemas/parameters"},
            "outputs": {"type": "array",
                        "items": {"$ref": "#/components/schemas/response_output"}}}},
    # redline's /v1
    "predict_instance": {
        "type": "object",
        "properties": {"entities": {"type": "object", "additionalProperties": {
                           "type": ["string", "integer"]}},
                       "request": {"type": "object", "additionalProperties": {
                           "type": ["number", "null"]}}}},
    "predict_request": {
        "type": "object",
        "properties": {
            "entities": {"type": "object"}, "request": {"type": "object"},
            "instances": {"type": "array",
                          "items": {"$ref": "#/components/schemas/predict_instance"}},
            "session_id": {"type": "string"}, "request_id": {"type": "string"},
            "budget_ms": {"type": "number"}, "model_version": {"type": "string"}}},
    "predict_response": {
        "type": "object", "required": ["model_name", "model_version", "path", "degraded"],
        "properties": {
            "model_name": {"type": "string"}, "model_version": {"type": "string"},
            "path": {"type": "string", "enum": ["primary", "fallback", "cache", "default"]},
            "degraded": {"type": "boolean"},
            "degraded_reasons": {"type": "array", "items": {"type": "string"}},
            # an inference graph's answer (docs/recommend.md): items best first
            "items": {"type": "array", "items": {
                "type": "object", "required": ["item_id", "score"],
                "properties": {"item_id": {"type": "string"}, "score": {"type": "number"}}}},
            "retrieved": {"type": "integer"},
            "timings_us": {"type": "object",
                           "additionalProperties": {"type": "integer"}}}},
}


def _op(summary: str, ok: dict[str, Any] | None = None, *, body: str | None = None,
        params: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None
        ) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary,
                          "responses": {"200": ok or _json(_ANY, "OK"), **ERRORS}}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {
            _JSON: {"schema": {"$ref": f"#/components/schemas/{body}"}}}}
    if extra:
        op["responses"].update(extra)
    return op


def _ref(name: str, description: str = "OK") -> dict[str, Any]:
    return _json({"$ref": f"#/components/schemas/{name}"}, description)


def builtin_operations() -> dict[tuple[str, str], dict[str, Any]]:
    """(method, template) -> OpenAPI operation, for the routes the server itself mounts."""
    ops: dict[tuple[str, str], dict[str, Any]] = {
        ("GET", "/v2"): _op("server metadata", _ref("metadata_server_response")),
        ("GET", "/v2/health/live"): _op("liveness", _json(_OBJECT, "live")),
        ("GET", "/v2/health/ready"): _op("readiness", _json(_OBJECT, "ready")),
        ("GET", "/v2/openapi.json"): _op("this document"),
        ("POST", "/v2/repository/index"): _op("repository index (admin)", _json(
            {"type": "array", "items": {"type": "object", "required": ["name", "version"]}},
            "every version on disk with its state")),
        ("POST", "/v2/repository/models/{name}/load"): _op("load a model (admin)",
                                                           params=[_NAME]),
        ("POST", "/v2/repository/models/{name}/unload"): _op("unload a model (admin)",
                                                             params=[_NAME]),
        ("POST", "/v1/models/{name}/predict"): _op(
            "entity prediction", _ref("predict_response"), body="predict_request",
            params=[_NAME, _BUDGET]),
        ("POST", "/v1/models/{name}/versions/{version}/predict"): _op(
            "entity prediction at a version", _ref("predict_response"), body="predict_request",
            params=[_NAME, _VERSION, _BUDGET]),
        ("GET", "/v1/pipeline/stats"): _op("pipeline counters"),
        ("POST", "/v1/events"): _op("ingest events (JSON lines or array)"),
        ("POST", "/v1/sessions/{session_id}/events"): _op(
            "add item events to a session (one or a list)", params=[_SESSION]),
        ("GET", "/v1/sessions/{session_id}"): _op("a session's items, newest first",
                                                  params=[_SESSION]),
    }
    for prefix, params in (("/v2/models/{name}", [_NAME]),
                           ("/v2/models/{name}/versions/{version}", [_NAME, _VERSION])):
        ops[("GET", prefix)] = _op("model metadata", _ref("metadata_model_response"),
                                   params=params)
        ops[("GET", prefix + "/ready")] = _op("model readiness", params=params)
        ops[("GET", prefix + "/config")] = _op("model configuration (Triton)", params=params)
        ops[("GET", prefix + "/stats")] = _op("model counters", params=params)
        ops[("POST", prefix + "/infer")] = _op(
            "inference", _ref("inference_response"), body="inference_request",
            params=[*params, _BUDGET, _PRIORITY])
    return ops


def document(routes: list[tuple[str, str, dict[str, Any] | None, bool]]) -> dict[str, Any]:
    """The document for these routes: (method, template, operation or None, admin)."""
    builtin = builtin_operations()
    paths: dict[str, dict[str, Any]] = {}
    for method, template, operation, _admin in routes:
        op = operation or builtin.get((method, template))
        if op is None:
            params = [{"name": p[1:-1], "in": "path", "required": True,
                       "schema": {"type": "string"}}
                      for p in template.split("/") if p.startswith("{")]
            # Mounted without a description: any content type (a /metrics page is text).
            op = _op(f"{method} {template}", {"description": "OK", "content": {"*/*": {}}},
                     params=params or None)
        paths.setdefault(template, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "redline", "version": __version__,
                 "description": "Open Inference Protocol v2 (KServe) and redline's /v1 entity "
                                "predictions. Errors: {\"error\": message, \"code\": code}."},
        "paths": paths,
        "components": {"schemas": SCHEMAS},
    }
