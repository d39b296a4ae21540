"""The request-path warm-up reads a present entity of the memory store (the first real read
merges tiles and derives values, first-time work the absent ``__warmup__`` entity skips),
without any counter, cache or observer seeing it."""

from __future__ import annotations

import time

import httpx
import orjson

from redline.serving.warmup import _present_entities, prepare_request_path
from tests.pipeline.conftest import make_settings


def test_warm_up_reads_a_present_entity_unseen(serve, repo_path, defs_path) -> None:  # type: ignore[no-untyped-def]
    srv = serve(make_settings(repo_path, defs_path))
    ts = int(time.time() * 1000)
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        body = b"\n".join(orjson.dumps({"card_id": "w1", "amount": a, "ts": ts - i})
                          for i, a in enumerate([10.0, 30.0]))
        assert c.post("/v1/events", content=body).status_code < 300
    pipeline = srv.server.pipeline
    route = pipeline.route(srv.server.registry.get("cards"))
    assert _present_entities(pipeline.store, route) == {"card": ["w1"]}
    states = [s for k, s in pipeline.store.data.items() if "{card:w1}" in k]
    assert states and all(s.out is None for s in states)  # written, never read
    before = orjson.dumps(pipeline.stats())
    assert prepare_request_path(srv.server.registry, pipeline) >= 1
    assert all(s.out is not None for s in states)  # the warm-up merged and derived them
    assert orjson.dumps(pipeline.stats()) == before  # no request, cache or counter saw it
