"""TF Serving's REST bodies (and KServe V1's): the ``instances`` (rows) or ``inputs`` (columns)
of a ``:predict`` request as a model's input arrays, checked as V2's JSON data is, and its
outputs as ``predictions`` or ``outputs``."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from redline.errors import InvalidInput
from redline.models.datatypes import V2_TO_NUMPY
from redline.serving.handle import ModelHandle
from redline.serving.protocol import array_from_json

SIGNATURE = "serving_default"


def load_body(body: bytes) -> tuple[Any, bool]:
    """The JSON body, and whether it needed the lenient parser: TF Serving's JSON allows the
    ``NaN``, ``Infinity`` and ``-Infinity`` tokens, which strict JSON (and orjson) refuse."""
    try:
        return orjson.loads(body), False
    except orjson.JSONDecodeError as exc:
        strict_error = exc
    try:
        return json.loads(body), True
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput(
            f"request body is not valid JSON ({strict_error}); send an object like "
            '{"instances": [[1.0, 2.0]]} (rows) or {"inputs": {"x": [[1.0, 2.0]]}} (columns)'
        ) from None


def payload_of(doc: Any) -> tuple[Any, bool]:
    """(the instances or inputs, whether it is the row format)."""
    if not isinstance(doc, dict):
        raise InvalidInput("the request body must be a JSON object with 'instances' (rows) or "
                           "'inputs' (columns)")
    signature = doc.get("signature_name")
    if signature not in (None, "", SIGNATURE):
        raise InvalidInput(f"signature_name {signature!r} is not served: redline models have "
                           f"one signature, '{SIGNATURE}'; leave signature_name out")
    if ("instances" in doc) == ("inputs" in doc):
        raise InvalidInput("send either 'instances' (row format) or 'inputs' (columnar "
                           "format), not both and not neither")
    if "instances" in doc:
        rows = doc["instances"]
        if not isinstance(rows, list) or not rows:
            raise InvalidInput("'instances' must be a non-empty list, one entry per row")
        return rows, True
    return doc["inputs"], False


def is_entity_rows(handle: ModelHandle, payload: Any, rows_format: bool) -> bool:
    """Whether a request is ``/v1`` rows: the model records feature names and the instances
    (or columns) are named by something other than its inputs."""
    if not handle.metadata.feature_names:
        return False
    first = payload[0] if rows_format else payload
    return isinstance(first, dict) and not set(first) <= handle.input_specs.keys()


def columns_to_rows(columns: Any) -> list[dict[str, Any]]:
    """Columnar ``/v1`` inputs (name -> one value per row) as rows."""
    lengths = {len(v) if isinstance(v, list) else -1 for v in columns.values()}
    if len(lengths) != 1 or -1 in lengths or 0 in lengths:
        raise InvalidInput("columnar 'inputs' of entity keys and request fields must map each "
                           "name to a non-empty list, all of the same length (one per row)")
    n = lengths.pop()
    return [{k: v[i] for k, v in columns.items()} for i in range(n)]


def input_tensors(handle: ModelHandle, payload: Any, rows_format: bool,
             lenient: bool) -> dict[str, np.ndarray]:
    """The model's named input arrays from the rows or columns."""
    specs = handle.input_specs
    names = list(specs)
    columns: dict[str, Any]
    if rows_format and isinstance(payload[0], dict):
        for i, row in enumerate(payload):
            if not isinstance(row, dict):
                raise InvalidInput(f"instances[{i}] must be an object of named inputs, like "
                                   "instances[0]")
            _check_names(handle, row, f"instances[{i}]")
        columns = {n: [row[n] for row in payload] for n in names}
    elif not rows_format and isinstance(payload, dict):
        _check_names(handle, payload, "'inputs'")
        columns = payload
    elif len(names) == 1:
        columns = {names[0]: payload}
    else:
        where = "each instance" if rows_format else "'inputs'"
        raise InvalidInput(f"model '{handle.name}' has inputs {names}: send {where} as an "
                           "object of them")
    arrays = {n: _array(n, specs[n].datatype, columns[n], lenient) for n in names}
    for n, array in arrays.items():
        if array.ndim == 0 or array.shape[0] == 0:
            raise InvalidInput(f"input '{n}' holds no rows; send at least one")
    return arrays


def _check_names(handle: ModelHandle, given: dict[str, Any], where: str) -> None:
    if given.keys() != handle.input_specs.keys():
        unknown = sorted(set(given) - handle.input_specs.keys())
        missing = sorted(handle.input_specs.keys() - set(given))
        raise InvalidInput(f"{where} names {sorted(given)} but model '{handle.name}' takes "
                           f"inputs {list(handle.input_specs)} (unknown: {unknown}, missing: "
                           f"{missing})")


def _array(name: str, datatype: str, data: Any, lenient: bool) -> np.ndarray:
    """One input as the model's datatype, checked as V2's JSON data is."""
    shape: list[int] = []
    probe = data
    while type(probe) is list:
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    dtype = V2_TO_NUMPY.get(datatype)
    if lenient and dtype is not None and dtype.kind == "f":
        # NaN and ±Infinity tokens: decoded as FP64 (no range check on non-finite values),
        # then refused or kept by the model's missing-value policy in ``handle.prepare``.
        wide = array_from_json(name, "FP64", shape, data)
        finite = np.abs(wide[np.isfinite(wide)])
        if finite.size and finite.max() > np.finfo(dtype).max:
            raise InvalidInput(f"input '{name}' has values outside the range of {datatype}")
        return wide.astype(dtype)
    return array_from_json(name, datatype, shape, data)


def encode_answer(handle: ModelHandle, outputs: dict[str, np.ndarray], rows: int,
            rows_format: bool) -> dict[str, Any]:
    """TF Serving's answer: one output unnamed, several by name; rows or columns."""
    values = {n: _plain(outputs[n]) for n in handle.output_names if n in outputs}
    if not rows_format:
        return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    for n, v in values.items():
        if not isinstance(v, list) or len(v) != rows:
            raise InvalidInput(f"model '{handle.name}' output '{n}' does not have one entry per "
                               "instance; use the columnar format ('inputs')")
    return {"predictions": [{n: v[i] for n, v in values.items()} for i in range(rows)]}


def _plain(array: np.ndarray) -> Any:
    """Nested lists of JSON values (strings for BYTES; NaN is written as null)."""
    if array.dtype.kind in "OS":
        flat = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                for v in array.ravel().tolist()]
        return np.array(flat, dtype=object).reshape(array.shape).tolist()
    return array.tolist()
