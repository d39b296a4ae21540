"""Warm the whole request path, not just the model: the first request after ready should cost
what the hundredth does.

Model warm-up (``runtime.warmup_batch_sizes``) runs each session, but the first real request
still paid for first-time work on the way: building the ``/v1`` route (plan, feature reader),
the first run of the request decoders and of the reader. Before readiness turns true the server
does that work itself, by calling the pieces directly with a synthetic body per model (V2 zeros
shaped from its metadata; ``/v1`` entity ``__warmup__``, request fields 0) rather than sending
itself requests, which observers, metrics, caches and counters would all see. Measured in
``benchmarks/first_request`` (docs/performance.md#first-request).
"""

from __future__ import annotations

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


def prepare_request_path(registry: Any, pipeline: Any) -> int:
    """Do the first-request work now, without sending a request (so no observer, metric, cache
    or counter sees it): build each model's ``/v1`` route (plan, feature reader) and run the
    ``/v1`` request decoder once. Returns how many models were prepared. Never raises."""
    from redline.serving.predict.request import parse_request

    done = 0
    for name in registry.models():
        try:
            handle = registry.get(name)
            body = v1_body(pipeline, handle)
            if body is not None:
                parse_request(orjson.loads(body), pipeline.max_instances)
                route = pipeline.route(handle)
                if route.reader is not None and pipeline.store.kind == "memory":
                    # the reader's first reads (the memory store only, so no shared store sees
                    # a read nobody asked for): an absent entity, then a present one when the
                    # store holds one (preloaded): merging tiles and deriving values have their
                    # own first-time costs (measured ~0.4 ms on the first real read)
                    read = getattr(route.reader, "read_timed", route.reader.read)  # as /v1
                    read({e: [WARMUP_ENTITY] for e in route.entity_names})
                    present = _present_entities(pipeline.store, route)
                    if present is not None:
                        for _ in range(ROUNDS):
                            read(present)
            orjson.loads(v2_body(handle))
            done += 1
        except Exception as exc:  # noqa: BLE001 - not loaded, or not a /v1 model: nothing to do
            log.debug("warm-up of %s skipped: %s", name, exc)
    return done


def _present_entities(store: Any, route: Any) -> dict[str, list[str]] | None:
    """One id per entity of ``route`` that the memory store holds data for, or None.

    Keys are ``rl:{<entity>:<id>}:<view>:<version>`` (features/online/base.py); the first key
    of each of the route's views gives its entity an id."""
    from redline.features.events import KEY_PREFIX

    wanted = {f":{v.name}:{v.version}": v.entity.name for v in route.views}
    found: dict[str, list[str]] = {}
    for key in list(getattr(store, "data", {}))[:10_000]:
        if not key.startswith(KEY_PREFIX + ":{"):
            continue
        close = key.find("}:")
        entity = wanted.get(key[close + 1:]) if close > 0 else None
        if entity is None or entity in found:
            continue
        head = key[len(KEY_PREFIX) + 2:close]
        if head.startswith(entity + ":"):
            found[entity] = [head[len(entity) + 1:]]
        if len(found) == len(route.entity_names):
            return found
    return None
