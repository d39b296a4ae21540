"""Session state shared by two server processes over Redis; caches and their invalidation."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import yaml

from redline.models import ModelRepository
from redline.serving.predict.sessions import MemorySessionStore, RedisSessionStore
from tests.conftest import free_port
from tests.logwatch import log_to
from tests.pipeline.conftest import PRIMARY_FEATURES, make_settings

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def start_process(tmp: Path, name: str, repo: Path, defs: Path, redis_url: str,
                  workers: int = 0) -> tuple[subprocess.Popen, str]:
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "repository": str(repo),
        "server": {"watch_repository": False},
        "runtime": {"warmup_batch_sizes": [1], "warmup_runs": 1},
        # a timeout for a busy shared machine: these tests prove atomicity, not latency
        "features": {"definitions": str(defs), "store": "redis", "redis_url": redis_url,
                     "redis_timeout_ms": 2000},
    }))
    port = free_port()
    args = [sys.executable, "-m", "redline.cli", "serve", "--config", str(config),
            "--http-port", str(port), "--no-grpc"]
    if workers:
        args += ["--workers", str(workers)]
    with log_to(tmp / f"{name}.log") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} (its log is above)")
        try:
            if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server not ready")


async def test_session_state_is_shared_by_two_processes(tmp_path, repo_path, defs_path,
                                                        redis_server):
    """A pool of two workers and a second server share one Redis: counters, events and item
    events posted to one are seen by the next request on the other; concurrent requests and
    posts to both lose nothing."""
    procs = [start_process(tmp_path, "a", repo_path, defs_path, redis_server.url, workers=2),
             start_process(tmp_path, "b", repo_path, defs_path, redis_server.url)]
    try:
        for proc, url in procs:
            await asyncio.to_thread(wait_ready, url, proc)
        urls = [url for _, url in procs]
        clients = [httpx.AsyncClient(base_url=u, timeout=10) for u in urls]

        async def call(i: int, session: str) -> dict:
            body = {"entities": {"card_id": "s"}, "request": {"amount": 1.0 + i % 2},
                    "session_id": session}
            r = await clients[i % 2].post("/v1/models/cards/predict", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        # Alternate, one at a time: every request sees the previous one's update.
        seq = [await call(i, "alt") for i in range(6)]
        assert [d["session"]["counters"]["requests"] for d in seq] == [1, 2, 3, 4, 5, 6]
        assert [d["session"]["events"] for d in seq] == [1, 2, 3, 4, 5, 6]
        # Concurrent, both replicas at once: every update lands exactly once.
        n = 60
        docs = await asyncio.gather(*(call(i, "burst") for i in range(n)))
        assert all("session" in d for d in docs), [d["degraded_reasons"] for d in docs]
        counts = sorted(d["session"]["counters"]["requests"] for d in docs)
        assert counts == list(range(1, n + 1)), "an update was lost or doubled"
        final = max(docs, key=lambda d: d["session"]["counters"]["requests"])
        assert final["session"]["counters"]["amount_sum"] == pytest.approx(1.5 * n)
        assert final["session"]["events"] == 20  # the last-N list is bounded
        await _item_events_are_shared(clients)
        for c in clients:
            await c.aclose()
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(30)


async def _item_events_are_shared(clients: list[httpx.AsyncClient]) -> None:
    for k in range(6):  # read-your-writes, alternating replicas (and the pool's workers)
        writer, reader = clients[k % 2], clients[(k + 1) % 2]
        r = await writer.post("/v1/sessions/rw/events",
                              json={"item_id": f"i{k}", "type": "click", "ts_ms": k})
        assert r.status_code == 200, r.text
        assert r.json()["session"]["counters"]["items"] == k + 1
        seen = (await reader.get("/v1/sessions/rw")).json()["items"]
        assert seen[0] == {"item_id": f"i{k}", "type": "click", "ts_ms": k}
        assert len(seen) == k + 1
    # a predict on the other replica counts the session's items among its counters
    body = {"entities": {"card_id": "s"}, "request": {"amount": 1.0}, "session_id": "rw"}
    doc = (await clients[0].post("/v1/models/cards/predict", json=body)).json()
    assert doc["session"]["counters"]["items_click"] == 6

    async def post(k: int) -> int:
        batch = [{"item_id": f"b{k}-{j}", "type": "view", "ts_ms": 100 * k + j}
                 for j in range(3)]
        r = await clients[k % 2].post("/v1/sessions/burst-items/events", json=batch)
        assert r.status_code == 200, r.text
        return int(r.json()["session"]["counters"]["items"])

    counts = await asyncio.gather(*(post(k) for k in range(40)))
    assert sorted(counts) == [3 * (k + 1) for k in range(40)], "an event was lost"
    items = (await clients[1].get("/v1/sessions/burst-items")).json()["items"]
    assert len(items) == 50  # pipeline.session_max_items keeps the newest 50


def test_redis_session_store_ttl_and_last_events(redis_server):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    store = RedisSessionStore(client, redis_server.url, ttl_s=0.3, max_events=3)
    for i in range(5):
        state = store.update("x", {"requests": 1}, orjson.dumps({"i": i}))
    assert state.counters == {"requests": 5.0}
    assert [orjson.loads(e)["i"] for e in state.events] == [2, 3, 4]
    time.sleep(0.45)
    assert store.get("x").counters == {}  # expired


def test_memory_session_store_is_atomic_under_threads():
    from concurrent.futures import ThreadPoolExecutor

    store = MemorySessionStore(ttl_s=60, max_events=5)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.update("t", {"requests": 1, "v": i}), range(400)))
    assert store.get("t").counters == {"requests": 400.0, "v": float(sum(range(400)))}


def add_version(repo_path: Path, scale: float) -> None:
    from sklearn.linear_model import LogisticRegression

    repo = ModelRepository(repo_path)
    meta = repo.metadata("cards", 1)
    x = np.random.default_rng(1).random((200, len(PRIMARY_FEATURES))).astype(np.float32) * scale
    y = (x[:, 0] > np.median(x[:, 0])).astype(int)
    repo.add_estimator("cards", LogisticRegression().fit(x, y), x,
                       feature_names=PRIMARY_FEATURES, feature_views=meta.feature_views)


def test_prediction_cache_hits_and_is_dropped_on_version_change(serve, repo_path, defs_path):
    settings = make_settings(repo_path, defs_path, prediction_cache_entries=100)
    srv = serve(settings)
    body = {"entities": {"card_id": "p1"}, "request": {"amount": 3.0}}
    with httpx.Client(base_url=srv.http, timeout=10) as c:
        first = c.post("/v1/models/cards/predict", json=body).json()
        second = c.post("/v1/models/cards/predict", json=body).json()
        assert first["path"] == "primary" and second["path"] == "cache"
        assert second["prediction"] == first["prediction"]
        other = c.post("/v1/models/cards/predict",
                       json={**body, "request": {"amount": 4.0}}).json()
        assert other["path"] == "primary"  # different input bytes: a miss
        stats = c.get("/v1/pipeline/stats").json()["prediction_cache"]
        assert (stats["hits"], stats["misses"], stats["entries"]) == (1, 2, 2)
        add_version(repo_path, 1.0)
        srv.call(srv.server.registry.sync())
        after = c.post("/v1/models/cards/predict", json=body).json()
        assert after["model_version"] == "2" and after["path"] == "primary"
        stats = c.get("/v1/pipeline/stats").json()["prediction_cache"]
        assert stats["entries"] == 1  # version 1's entries were dropped
        pinned = c.post("/v1/models/cards/versions/2/predict", json=body).json()
        assert pinned["model_version"] == "2" and pinned["path"] == "cache"
        assert c.get("/v1/pipeline/stats").json()["prediction_cache"]["entries"] == 1


def test_near_cache_bounded_staleness_and_version_change(serve, repo_path, defs_path):
    settings = make_settings(repo_path, defs_path, feature_cache_entries=100,
                             feature_cache_max_staleness_ms=60_000.0)
    srv = serve(settings)
    ts = int(time.time() * 1000)
    body = {"entities": {"card_id": "z1"}, "request": {"amount": 3.0}}

    def ingest(c: httpx.Client, i: int) -> None:
        ev = orjson.dumps({"card_id": "z1", "amount": 100.0, "ts": ts + i})
        assert c.post("/v1/events", content=ev).json()["accepted"] == 1

    with httpx.Client(base_url=srv.http, timeout=10) as c:
        ingest(c, 0)
        first = c.post("/v1/models/cards/predict", json=body).json()
        ingest(c, 1)
        cached = c.post("/v1/models/cards/predict", json=body).json()
        # The second event is not seen yet: the row came from the near cache (within 60 s).
        assert cached["prediction"] == first["prediction"] and not cached["degraded"]
        stats = c.get("/v1/pipeline/stats").json()["feature_cache"]
        assert stats["hits"] == 1
        add_version(repo_path, 1.0)
        srv.call(srv.server.registry.sync())
        c.post("/v1/models/cards/predict", json=body)
        assert c.get("/v1/pipeline/stats").json()["feature_cache"]["hits"] == 1  # dropped: miss
    # Staleness 0: every request reads the store.
    settings0 = make_settings(repo_path, defs_path, feature_cache_entries=100,
                              feature_cache_max_staleness_ms=0.0)
    srv0 = serve(settings0)
    with httpx.Client(base_url=srv0.http, timeout=10) as c:
        ingest(c, 0)
        a = c.post("/v1/models/cards/predict", json=body).json()
        ingest(c, 1)
        b = c.post("/v1/models/cards/predict", json=body).json()
        assert a["prediction"] != b["prediction"]
        assert c.get("/v1/pipeline/stats").json()["feature_cache"]["hits"] == 0
