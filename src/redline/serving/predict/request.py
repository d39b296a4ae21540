"""A ``/v1`` request, decoded and checked: entity ids per entity, request fields as columns.

Transport-free: the REST and gRPC edges build a :class:`PredictRequest` from their wire form; the
checks that need the model (which entity keys it reads, which request fields) run here too, in
the decode stage, so a malformed request is a 400 before anything shared (the store, the breaker,
a coalesced read) sees it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from redline.errors import InvalidInput
from redline.serving.predict.sessions import check_session_id

# A request field value: a number, or None (missing).
FieldValue = float | int | None


@dataclass(slots=True)
class PredictRequest:
    """A decoded ``/v1`` request: one row per instance. Shared by REST and gRPC."""

    entities: list[dict[str, Any]]
    fields: list[dict[str, Any]]
    batch: bool
    session_id: str | None = None
    request_id: str | None = None
    budget_ms: Any = None  # as sent (validated by deadline.parse_budget); None: not sent
    version: str | None = None


def parse_request(doc: Any, max_instances: int) -> PredictRequest:
    """The REST body: one instance inline, or ``{"instances": [...]}`` for many."""
    if not isinstance(doc, dict):
        raise InvalidInput("the request body must be a JSON object with 'entities' and 'request' "
                           "(or 'instances': [...])")
    batch = "instances" in doc
    if batch:
        rows = doc["instances"]
        if not isinstance(rows, list) or not rows:
            raise InvalidInput("'instances' must be a non-empty list of {entities, request}")
        check_count(len(rows), max_instances)
    else:
        rows = [doc]
    entities, fields = [], []
    for i, row in enumerate(rows):
        where = f"instances[{i}]" if batch else "body"
        if not isinstance(row, dict):
            raise InvalidInput(f"{where} must be an object with 'entities' and 'request'")
        ent = row.get("entities", {})
        req = row.get("request", {})
        if not isinstance(ent, dict):
            raise InvalidInput(f"{where}.entities must be an object of entity key -> id")
        if not isinstance(req, dict):
            raise InvalidInput(f"{where}.request must be an object of field -> value")
        entities.append(ent)
        fields.append(req)
    session_id = doc.get("session_id")
    if session_id is not None:
        session_id = check_session_id(session_id)
    request_id = doc.get("request_id", doc.get("id"))
    if request_id is not None:
        if isinstance(request_id, bool) or not isinstance(request_id, str | int | float):
            raise InvalidInput("'request_id' must be a string")
        request_id = str(request_id)
    version = doc.get("model_version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, str | int)):
        raise InvalidInput("'model_version' must be a string or an integer")
    return PredictRequest(entities, fields, batch, session_id, request_id,
                          doc.get("budget_ms"), str(version) if version is not None else None)


def check_count(rows: int, max_instances: int) -> None:
    if rows > max_instances:
        raise InvalidInput(f"{rows} instances exceed pipeline.max_instances ({max_instances}); "
                           "split the batch")


def entity_ids(keys: dict[str, str], entity_names: list[str], model: str,
               rows: list[dict[str, Any]], batch: bool) -> dict[str, list[str]]:
    """Entity name -> one id per row. ``keys`` maps every accepted key (join key or entity name)
    to its entity; an entity given twice in one row, by any alias, is refused, naming both."""
    ids: dict[str, list[str]] = {e: [] for e in entity_names}
    for i, ent in enumerate(rows):
        seen: dict[str, str] = {}
        for key, value in ent.items():
            entity = keys.get(key)
            if entity is None:
                known = sorted(k for k in keys if k not in entity_names) or \
                    ["(none: this model reads no entity features)"]
                raise InvalidInput(
                    f"unknown entity key '{key}'{_at(i, batch)} for model '{model}'; it takes: "
                    f"{', '.join(known)}"
                )
            if entity in seen:
                raise InvalidInput(
                    f"entity '{entity}' is given twice{_at(i, batch)}: '{seen[entity]}' and "
                    f"'{key}' both name it; send one of them"
                )
            if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
                raise InvalidInput(f"entity key '{key}'{_at(i, batch)} must be a non-empty "
                                   f"string or integer id, got {_short(value)}")
            ids[entity].append(str(value))
            seen[entity] = key
        for entity in entity_names:
            if entity not in seen:
                join = next(k for k, e in keys.items() if e == entity and k != entity)
                raise InvalidInput(f"missing entity key '{join}'{_at(i, batch)}: model "
                                   f"'{model}' reads features of entity '{entity}'")
    return ids


def request_columns(names: list[str], model: str, rows: list[dict[str, Any]], batch: bool
                    ) -> dict[str, np.ndarray]:
    """Field name -> float64 column; ``None`` (JSON null) is a missing value (NaN)."""
    cols: dict[str, np.ndarray] = {}
    n = len(rows)
    for name in names:
        col = np.empty(n, dtype=np.float64)
        for i, row in enumerate(rows):
            value = row.get(name, _ABSENT)
            if value is _ABSENT:
                raise InvalidInput(f"missing required request field '{name}'{_at(i, batch)} "
                                   f"(model '{model}' needs: {', '.join(names)})")
            if value is None:
                col[i] = math.nan
            elif type(value) is float or type(value) is int:  # not bool: true is not 1
                if not math.isfinite(value) or abs(value) > _FLOAT_MAX:
                    raise InvalidInput(f"request field '{name}'{_at(i, batch)} must be a finite "
                                       f"number (null for a missing value), got {value!r}")
                col[i] = value
            else:
                raise InvalidInput(f"request field '{name}'{_at(i, batch)} must be a number, "
                                   f"got {_short(value)}")
        cols[name] = col
    return cols


_ABSENT = object()
_FLOAT_MAX = 3.4028234e38  # beyond FP32 a value would become inf in the model input


def _at(i: int, batch: bool) -> str:
    return f" in instances[{i}]" if batch else ""


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:
        text = "a deeply nested value"
    return text if len(text) <= 60 else text[:57] + "..."
