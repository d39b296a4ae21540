"""Labels and quality with ``redline serve --workers 2``: one join every worker shares.

A real pool of two workers (SQLite file in the pool's state directory, or a real redis-server),
predictions with request ids over many connections (so both workers serve), labels over other
connections: the quality figures every worker answers equal a direct computation over all the
pairs. With Redis, the server is killed mid-way: labels get a clear 503, predictions keep going,
and after the restart the predictions made meanwhile still take their labels.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

from tests.conftest import RedisServer
from tests.monitoring.served import make_repository, training_data, v2_body
from tests.scaling.procs import Serve

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

CONFIG = ("runtime:\n  warmup_batch_sizes: [1]\n  warmup_runs: 1\n"
          "server:\n  watch_repository: false\n  drain_timeout_s: 5\n"
          "monitoring:\n  tick_s: 0.2\n  quality_store_timeout_ms: 300\n")


def pool(tmp_path: Path, *extra: str) -> Serve:
    make_repository(tmp_path / "repo")
    serve = Serve(tmp_path, "--workers", "2", "--no-grpc", *extra, config=CONFIG).wait_ready()
    serve.wait_children(2)
    deadline = time.monotonic() + 60
    while serve.log.read_text().count("redline serving") < 2:
        assert time.monotonic() < deadline, serve.log.read_text()[-2000:]
        time.sleep(0.05)
    return serve


def predict(url: str, prefix: str, n: int, connections: int = 8) -> dict[str, float]:
    """``n`` predictions with ids ``prefix-i``, over ``connections`` keep-alive connections."""
    rng = np.random.default_rng(len(prefix))
    x = training_data(rng, n)
    scores: dict[str, float] = {}
    lock = threading.Lock()

    def run(k: int) -> None:
        with httpx.Client(base_url=url, timeout=10) as client:
            for i in range(k, n, connections):
                rid = f"{prefix}-{i}"
                r = client.post("/v2/models/fraud/infer", json=v2_body(x[i:i + 1], rid))
                assert r.status_code == 200, r.text
                out = {o["name"]: o["data"] for o in r.json()["outputs"]}
                with lock:
                    scores[rid] = float(out["probabilities"][1])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(scores) == n
    return scores


def served_by_each_worker(url: str, pids: int = 2) -> dict[int, float]:
    """Requests each worker answered, from its own summary (a fresh connection each time).
    A worker's summary counts its requests at its next monitor tick, which a busy machine can
    delay: read again (for a few seconds) until every worker counts some."""
    seen: dict[int, float] = {}
    deadline = time.monotonic() + 10
    for _ in range(1000):
        summary = httpx.get(f"{url}/v1/monitoring/summary", timeout=10).json()
        seen[summary["worker_pid"]] = sum(
            s["rate"] * p["dt"] for p in summary["history"] for s in p["series"].values()
            if s["api"] == "v2")
        if len(seen) == pids and (all(seen.values()) or time.monotonic() > deadline):
            break
    return seen


def post_labels(url: str, labels: dict[str, float], per_post: int = 100) -> dict[str, int]:
    """Labels in several posts, each on a fresh connection (any worker takes it)."""
    total = {"joined": 0, "unmatched": 0, "late": 0, "duplicate": 0}
    items = list(labels.items())
    for start in range(0, len(items), per_post):
        body = {"labels": [{"request_id": rid, "label": y}
                           for rid, y in items[start:start + per_post]]}
        r = httpx.post(f"{url}/v1/labels", json=body, timeout=30)
        assert r.status_code == 200, r.text
        for k in total:
            total[k] += r.json()[k]
    return total


def quality_from_every_worker(url: str) -> list[dict[str, Any]]:
    answers: dict[int, dict[str, Any]] = {}
    for _ in range(200):
        r = httpx.get(f"{url}/v1/models/fraud/quality", timeout=10)
        assert r.status_code == 200, r.text
        answers[r.json()["label_join"]["worker_pid"]] = r.json()
        if len(answers) == 2:
            break
    assert len(answers) == 2, "one worker answered every quality read"
    return list(answers.values())


def direct(scores: dict[str, float], labels: dict[str, float]) -> dict[str, float]:
    p = np.array([scores[r] for r in labels])
    y = np.array(list(labels.values()))
    return {"roc_auc": roc_auc_score(y, p), "log_loss": log_loss(y, p),
            "accuracy": accuracy_score(y, p >= 0.5)}


def check(answer: dict[str, Any], expected: dict[str, float], labelled: int) -> None:
    (version,) = answer["versions"]
    assert version["labelled"] == labelled
    for metric, value in expected.items():
        assert version["realised"][metric] == pytest.approx(value, abs=2e-5), metric


def labels_for(scores: dict[str, float], seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    return {rid: float(rng.random() < p) for rid, p in scores.items()}


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_pool_joins_labels_and_every_worker_reports_the_same_quality(
        tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    extra: tuple[str, ...] = ()
    if store == "redis":
        redis = request.getfixturevalue("redis_server")
        extra = ("--store", "redis", "--redis-url", redis.url)
    serve = pool(tmp_path, *extra)
    try:
        scores = predict(serve.url, "a", 800)
        served = served_by_each_worker(serve.url)
        assert len(served) == 2 and all(n > 0 for n in served.values()), served
        labels = labels_for(scores, 1)
        # Labels right away: some predictions still wait in the other worker's memory for its
        # next tick; the route waits a tick for those before it calls them unmatched.
        got = post_labels(serve.url, {**labels, "never-predicted": 1.0})
        assert got == {"joined": 800, "unmatched": 1, "late": 0, "duplicate": 0}
        # Posting the same labels again: each prediction joins once only; the second label
        # of each is a duplicate, whichever worker joined the first.
        again = post_labels(serve.url, dict(list(labels.items())[:10]))
        assert again == {"joined": 0, "unmatched": 0, "late": 0, "duplicate": 10}
        for answer in quality_from_every_worker(serve.url):
            assert answer["label_join"] == {"store": store, "shared": True,
                                            "worker_pid": answer["label_join"]["worker_pid"]}
            check(answer, direct(scores, labels), 800)
            assert answer["unmatched_labels"] == 1
            assert answer["versions"][0]["pending_join"] == 0
            # CBPE over every worker's predictions, not one worker's share
            p = np.array(list(scores.values()))
            assert answer["versions"][0]["estimated"]["accuracy"] == pytest.approx(
                np.mean(np.maximum(p, 1 - p)), abs=1e-4)
        metrics = httpx.get(f"{serve.url}/metrics", timeout=10).text
        assert 'redline_labels_total{outcome="joined"} 800.0' in metrics
    finally:
        assert serve.stop() == 0
    assert "Traceback" not in serve.log.read_text()


def test_redis_killed_mid_way_labels_get_503_and_the_join_recovers(
        tmp_path: Path, redis_server: RedisServer) -> None:
    serve = pool(tmp_path, "--store", "redis", "--redis-url", redis_server.url)
    try:
        before = predict(serve.url, "before", 200)
        assert post_labels(serve.url, labels_for(before, 2))["joined"] == 200
        redis_server.kill()
        # Predictions go on (no feature reads here); their join waits in each worker's memory.
        during = predict(serve.url, "during", 200)
        for _ in range(4):  # whichever worker answers: a clear 503, never a 500
            r = httpx.post(f"{serve.url}/v1/labels", timeout=10,
                           json={"labels": [{"request_id": "during-0", "label": 1}]})
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "store_unavailable"
            assert "label join's Redis" in r.json()["error"]
            q = httpx.get(f"{serve.url}/v1/models/fraud/quality", timeout=10)
            assert q.status_code == 503 and q.json()["code"] == "store_unavailable", q.text
        redis_server.restart()  # empty: the earlier pairs are gone, the waiting predictions not
        labels = labels_for(during, 3)
        deadline = time.monotonic() + 20
        while True:  # the workers' next ticks write what waited
            got = post_labels(serve.url, dict(list(labels.items())[:1]))
            if got["joined"] == 1 or time.monotonic() > deadline:
                break
        assert got["joined"] == 1
        assert post_labels(serve.url, dict(list(labels.items())[1:]))["joined"] == 199
        for answer in quality_from_every_worker(serve.url):
            check(answer, direct(during, labels), 200)
    finally:
        assert serve.stop() == 0
    log = serve.log.read_text()
    assert "Traceback" not in log
    assert "label join: predictions wait in memory" in log


def test_a_pools_join_is_bounded_and_counts_late_and_unmatched_labels(tmp_path: Path) -> None:
    """A pool with a small join: at most ``capacity`` predictions wait (in the file itself),
    as many ids that left are remembered, so their labels count as late; older ones and
    unknown ids as unmatched; nothing is dropped without a count."""
    make_repository(tmp_path / "repo")
    path = tmp_path / "state" / "labels.sqlite"
    config = CONFIG + (f"  quality_join_capacity: 100\n  quality_window: 50\n"
                       f"  quality_path: {path}\n")
    serve = Serve(tmp_path, "--workers", "2", "--no-grpc", config=config).wait_ready()
    try:
        serve.wait_children(2)
        scores = predict(serve.url, "b", 300)
        time.sleep(1.0)  # both workers' ticks have written and evicted
        with sqlite3.connect(path) as db:
            counts = dict(db.execute("SELECT 'pending', count(*) FROM pending UNION ALL "
                                     "SELECT 'gone', count(*) FROM gone UNION ALL "
                                     "SELECT 'recent', count(*) FROM recent"))
        assert counts == {"pending": 100, "gone": 100, "recent": 50}
        got = post_labels(serve.url, labels_for(scores, 4), per_post=300)
        assert got == {"joined": 100, "late": 100, "unmatched": 100, "duplicate": 0}
        (answer, _) = quality_from_every_worker(serve.url)
        version = answer["versions"][0]
        assert version["evicted"] == 200 and version["late_labels"] == 100
        assert version["pending_join"] == 0 and version["labelled"] == 50  # the window
        assert answer["unmatched_labels"] == 100
        assert answer["label_join"]["store"] == "sqlite"
    finally:
        assert serve.stop() == 0


def test_a_pool_sends_each_quality_alert_once(
        tmp_path: Path, webhook_receiver: tuple[str, list[dict[str, Any]]]) -> None:
    """Every worker computes the same (shared) quality alarm; only the worker holding the
    alert lease calls the webhook, so it is called once, not once per worker."""
    url, got = webhook_receiver
    make_repository(tmp_path / "repo")
    config = CONFIG + f"  alert_webhook_url: {url}\n"
    serve = Serve(tmp_path, "--workers", "2", "--no-grpc", config=config).wait_ready()
    try:
        serve.wait_children(2)
        scores = predict(serve.url, "c", 400)
        rng = np.random.default_rng(5)
        noise = {rid: float(rng.integers(0, 2)) for rid in scores}  # unrelated: AUC ~0.5
        assert post_labels(serve.url, noise)["joined"] == 400
        for answer in quality_from_every_worker(serve.url):
            assert answer["versions"][0]["alarm"], answer  # both workers see the alarm
        time.sleep(3.0)  # several evaluations on both workers
    finally:
        assert serve.stop() == 0
    quality = [a for a in got if a["alert"] == "quality:fraud:1"]
    assert [a["status"] for a in quality] == ["firing"], got
