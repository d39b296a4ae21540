"""The admin API in a pool: ``redline serve --workers 2 --admin-token T``.

A real pool of two workers (shared SQLite join and review queue in the pool's state directory).
The read-only admin routes answer from whichever worker a connection reaches: the review queue
is one list (each worker queues at most one item here, so two items means both queued into it),
a reviewer's label is taken from any worker, once. Load and unload would change one process
only: every worker answers them 409 ``per_worker_state`` naming the fix, and keeps serving.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.monitoring.served import make_repository, training_data, v2_body
from tests.scaling.procs import Serve
from tests.scaling.test_labels_pool import CONFIG, predict

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

TOKEN = "pool-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# review_per_minute 0.6: a bucket of one token per worker, refilled once in 100 s.
POOL_CONFIG = CONFIG + "  review_per_minute: 0.6\n"


def pinned_clients(url: str, workers: int = 2) -> dict[int, httpx.Client]:
    """One keep-alive client per worker (a connection stays with the worker that accepted it)."""
    clients: dict[int, httpx.Client] = {}
    for _ in range(200):
        client = httpx.Client(base_url=url, timeout=30, headers=AUTH)
        pid = client.get("/v1/monitoring/summary").json()["worker_pid"]
        if pid in clients:
            client.close()
            continue
        clients[pid] = client
        if len(clients) == workers:
            return clients
    raise AssertionError(f"only workers {sorted(clients)} answered")


def answered_by(client: httpx.Client) -> int:
    return int(client.get("/v1/monitoring/summary").json()["worker_pid"])


def test_a_pool_serves_the_read_only_admin_routes_and_refuses_load_and_unload(
        tmp_path: Path) -> None:
    make_repository(tmp_path / "repo")
    serve = Serve(tmp_path, "--workers", "2", "--no-grpc", "--admin-token", TOKEN,
                  config=POOL_CONFIG).wait_ready()
    clients: dict[int, httpx.Client] = {}
    try:
        serve.wait_children(2)
        clients = pinned_clients(serve.url)
        (pid_a, a), (pid_b, b) = clients.items()
        # Out-of-range rows (age far above training) on each worker's connection: each queues
        # one review item (its one token), into the one shared queue.
        rng = np.random.default_rng(7)
        x = training_data(rng, 20)
        x[:, 1] += 100
        for client, prefix in ((a, "a"), (b, "b")):
            for i in range(10):
                r = client.post("/v2/models/fraud/infer",
                                json=v2_body(x[i:i + 1] if prefix == "a" else x[10 + i:11 + i],
                                             f"{prefix}-{i}"))
                assert r.status_code == 200, r.text
        queues: dict[int, list[dict[str, Any]]] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # each worker's tick queues its item
            queues = {pid: c.get("/v1/review").json()["items"] for pid, c in clients.items()}
            if all(len(items) == 2 for items in queues.values()):
                break
            time.sleep(0.2)
        assert [len(items) for items in queues.values()] == [2, 2], queues
        ids = sorted(i["id"] for i in queues[pid_a])
        assert ids == sorted(i["id"] for i in queues[pid_b])  # one queue, seen from both
        assert {i["request_id"][0] for i in queues[pid_a]} == {"a", "b"}
        assert all(any(r.startswith("out_of_range") for r in i["reasons"])
                   for i in queues[pid_a])
        # A reviewer's label through each worker; the second take of an item is a 404.
        for client, item_id in ((a, ids[0]), (b, ids[1])):
            done = client.post(f"/v1/review/{item_id}/label",
                               json={"label": 1, "reviewer": "pool"})
            assert done.status_code == 200, done.text
            assert done.json()["label"] == 1.0
        again = b.post(f"/v1/review/{ids[0]}/label", json={"label": 0})
        assert again.status_code == 404, again.text
        for client in (a, b):
            assert client.get("/v1/review").json()["items"] == []
            assert client.get("/v1/review/export").status_code == 200
        # The slow log answers from each worker, naming it.
        for pid, client in clients.items():
            slow = client.get("/v1/debug/slow")
            assert slow.status_code == 200 and slow.json()["worker_pid"] == pid, slow.text
            assert client.post("/v2/repository/index").status_code == 200
        # Load and unload change one process: refused by every worker, with the fix.
        for pid, client in clients.items():
            for action in ("load", "unload"):
                r = client.post(f"/v2/repository/models/fraud/{action}")
                assert r.status_code == 409, r.text
                assert r.json()["code"] == "per_worker_state"
                message = r.json()["error"]
                assert "model 'fraud'" in message and "every worker watches" in message
                assert "--workers 1" in message
            assert answered_by(client) == pid  # the connection still reaches the same worker
            assert client.post("/v2/models/fraud/infer",
                               json=v2_body(x[:1])).status_code == 200  # nothing unloaded
        # Without the token the admin routes are still a 401, not a 409.
        bare = httpx.post(f"{serve.url}/v2/repository/models/fraud/unload", timeout=10)
        assert bare.status_code == 401, bare.text
        assert httpx.get(f"{serve.url}/v1/review", timeout=10).status_code == 401
        assert predict(serve.url, "after", 40)  # the pool keeps serving
    finally:
        for client in clients.values():
            client.close()
        assert serve.stop() == 0
    assert "Traceback" not in serve.log.read_text()
