"""Warm the whole request path, not just the model: the first request after ready should cost
what the hundredth does.

Model warm-up (``runtime.warmup_batch_sizes``) runs each session, but the first real request
still paid for first-time work on the way: building the ``/v1`` route (plan, feature reader),
the JSON decoders, the store client, the inline-run estimate. So after the listener is up and
before readiness turns true, the server sends itself a few real requests over loopback for every
served model: V2 ``infer`` with zeros shaped from its metadata, and ``/v1 predict`` (entity
``__warmup__``, request fields 0) where the model reads features. Measured in
``benchmarks/first_request`` (docs/performance.md#first-request).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

log = logging.getLogger("redline.serving")

ROUNDS = 3
WARMUP_ENTITY = "__warmup__"


def v2_body(handle: Any) -> bytes:
    inputs = []
    for spec in handle.session.inputs:
        shape = [1 if d is None or d < 0 else d for d in (spec.shape or [1])]
        count = 1
        for d in shape:
            count *= d
        value: Any = "" if spec.datatype == "BYTES" else (False if spec.datatype == "BOOL" else 0)
        inputs.append({"name": spec.name, "datatype": spec.datatype, "shape": shape,
                       "data": [value] * count})
    return orjson.dumps({"inputs": inputs})


def v1_body(pipeline: Any, handle: Any) -> bytes | None:
    """A /v1 body for ``handle``, or None when the model reads no features (no /v1 route)."""
    if pipeline is None or getattr(pipeline, "defs", None) is None:
        return None
    try:
        route = pipeline.route(handle)
    except Exception:  # noqa: BLE001 - a model that /v1 cannot serve is simply not warmed there
        return None
    if not route.views:
        return None
    entities = {v.entity.join_key: WARMUP_ENTITY for v in route.views}
    return orjson.dumps({"entities": entities,
                         "request": {f: 0 for f in route.request_fields}})


async def _post(host: str, port: int, path: str, body: bytes) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\nconnection: close\r\n\r\n"
                     % (path.encode(), host.encode(), len(body)) + body)
        await writer.drain()
        status_line = await reader.readline()
        await reader.read()
        parts = status_line.split()
        return int(parts[1]) if len(parts) > 1 else 0
    finally:
        writer.close()


async def warm_request_path(registry: Any, pipeline: Any, host: str, port: int) -> int:
    """Send the warm-up requests; returns how many were answered 200. Never raises."""
    target = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    ok = 0
    for name in registry.models():
        try:
            handle = registry.get(name)
        except Exception:  # noqa: BLE001 - not loaded (failed or unloaded): nothing to warm
            continue
        calls = [(f"/v2/models/{name}/infer", v2_body(handle))]
        body = v1_body(pipeline, handle)
        if body is not None:
            calls.append((f"/v1/models/{name}/predict", body))
        for path, payload in calls:
            for _ in range(ROUNDS):
                try:
                    status = await asyncio.wait_for(_post(target, port, path, payload), 10)
                except (TimeoutError, OSError) as exc:
                    log.debug("warm-up %s: %s", path, exc)
                    break
                if status != 200:
                    log.debug("warm-up %s answered %s", path, status)
                    break
                ok += 1
    return ok
