"""The shared label join: two processes' backends (SQLite file, real Redis) see one join.

Each test builds two backends over the same store, as two workers would, writes predictions
through one and labels through the other, and checks the joined figures, the bounds, the
late/unmatched counts, and (Redis) an outage: a clear StoreUnavailable, predictions kept, and
recovery.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from redline.config import Settings
from redline.errors import ConfigError, NotFound, StoreUnavailable
from redline.monitoring.joinstore import MemoryBackend, join_backend, join_backend_kind, join_labels
from redline.monitoring.joinstore_redis import RedisBackend
from redline.monitoring.joinstore_sqlite import SqliteBackend
from redline.monitoring.quality import QualityMonitor
from redline.monitoring.review import ReviewQueue
from redline.monitoring.reviewstore import review_store
from tests.conftest import RedisServer

Factory = Callable[[], Any]


@pytest.fixture(params=["sqlite", "redis"])
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """A maker of backends that all share one store (one per simulated worker)."""
    if request.param == "sqlite":
        path = str(tmp_path / "state" / "labels.sqlite")
        return lambda: SqliteBackend(path)
    redis = request.getfixturevalue("redis_server")
    return lambda: RedisBackend(redis.url)


def outcome(states: list[Any], ids: list[str], labels: list[float]
            ) -> tuple[int, list[str], int, int]:
    got = join_labels(states, ids, labels)
    return got.joined, got.unmatched, got.late, got.duplicate


def monitor(backend: Any, capacity: int = 100_000, window: int = 5000) -> QualityMonitor:
    return QualityMonitor("m", "1", "classification", {"roc_auc": 0.9}, capacity, 3600.0,
                          window, 0.05, backend.state("m", "1", capacity, 3600.0, window))


def test_two_workers_join_and_report_the_same_figures(backends: Factory) -> None:
    a, b = backends(), backends()
    qa, qb = monitor(a), monitor(b)
    rng = np.random.default_rng(3)
    p = rng.random(3000)
    y = (rng.random(3000) < p).astype(float)
    ids = [f"r{i}" for i in range(3000)]
    qa.predicted(ids[:1500], p[:1500])  # worker a served the first half, b the second
    qb.predicted(ids[1500:], p[1500:])
    a.flush()
    b.flush()
    # Labels reach the "other" worker: a's predictions are labelled through b and vice versa.
    assert outcome([qb.state], ids[:1500], y[:1500].tolist()) == (1500, [], 0, 0)
    assert outcome([qa.state], ids[1500:], y[1500:].tolist()) == (1500, [], 0, 0)
    # r0 has its label (through the other worker): a second one is a duplicate, not a pair
    assert outcome([qa.state], ["r0", "nope"], [1.0, 0.0]) == (0, ["nope"], 0, 1)
    ra, rb = qa.report(), qb.report()
    for r in (ra, rb):
        assert r["labelled"] == 3000 and r["pending_join"] == 0 and r["joined"] == 3000
        assert r["realised"]["roc_auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-5)
        assert r["realised"]["log_loss"] == pytest.approx(log_loss(y, p), abs=1e-5)
    assert ra["realised"] == rb["realised"] and ra["estimated"] == rb["estimated"]
    # every worker's recent scores feed the estimate: 3000 rows, not one worker's 1500
    assert ra["estimated"]["accuracy"] == pytest.approx(np.mean(np.maximum(p, 1 - p)), abs=1e-4)


def test_bounds_late_and_unmatched(backends: Factory) -> None:
    a, b = backends(), backends()
    qa, qb = monitor(a, capacity=1000, window=300), monitor(b, capacity=1000, window=300)
    for start in range(0, 5000, 500):
        qa.predicted([f"r{i}" for i in range(start, start + 500)], np.full(500, 0.7))
        a.flush()
    r = qb.report()
    assert r["pending_join"] == 1000 and r["evicted"] == 4000
    assert r["labelled"] == 0 and len(qb.state.snapshot().recent) == 300  # capped
    # r0..r3999 left unlabelled: the last 1000 of them (capacity) are remembered, so their
    # labels count as late; r0 is forgotten too (unmatched), r4999 joins, x was never seen.
    got = outcome([qb.state], ["r0", "r3000", "r3999", "r4999", "x"], [1.0, 1.0, 1.0, 1.0, 0.0])
    assert got == (1, ["r0", "x"], 2, 0)
    assert qa.report()["late_labels"] == 2
    b.count_unmatched("m", 1)
    assert a.unmatched("m") == 1
    # the joined pairs are capped at the window too
    joined = join_labels([qa.state], [f"r{i}" for i in range(4000, 4999)], [1.0] * 999).joined
    assert joined == 999 and qb.report()["labelled"] == 300
    # the joined ids are remembered as many as the capacity: a second label is a duplicate
    # (r4999, r4000..r4998); none of them is counted twice
    again = outcome([qb.state], ["r4999", "r4000", "r4998"], [0.0] * 3)
    assert again == (0, [], 0, 3) and qa.report()["joined"] == 1000


def test_recent_scores_are_the_last_window_whatever_the_batches(backends: Factory) -> None:
    """Batches of 1 to 700 scores from two workers: the window is exactly the last 300 scores
    in the order they were written (Redis keeps a blob a batch, trimmed by count)."""
    a, b = backends(), backends()
    qa, qb = monitor(a, window=300), monitor(b, window=300)
    rng = np.random.default_rng(5)
    written: list[float] = []
    for n, size in enumerate([1, 7, 250, 3, 700, 2, 1, 299, 40, 1, 1, 5]):
        q, backend = (qa, a) if n % 2 else (qb, b)
        scores = rng.random(size)
        q.predicted([""] * size, scores)  # a ranker's candidates: no request id each
        backend.flush()
        written += scores.tolist()
        for state in (qa.state, qb.state):
            assert state.snapshot().recent.tolist() == written[-300:]
    if isinstance(a, RedisBackend):  # Redis holds the window: its oldest blob is needed
        held = [int(c) for c in a.client.lrange(qa.state.keys["recent_n"], 0, -1)]
        assert sum(held) >= 300 > sum(held[1:]), held


def test_a_rankers_ids_go_in_small_pipelines_and_all_join(redis_server: RedisServer,
                                                             monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Ten requests of 100 candidates, each with an id: written in pipelines of at most
    IDS_PER_PIPELINE ids with a hand-over to the loop between two (redis-py packs every
    argument holding the GIL), and every candidate joins its label."""
    from redline.monitoring import joinstore_redis

    handovers: list[int] = []
    monkeypatch.setattr(joinstore_redis, "yield_to_loop", lambda: handovers.append(1))
    backend = RedisBackend(redis_server.url)
    q = monitor(backend)
    ids = [f"req{r}:{i}" for r in range(10) for i in range(100)]
    scores = np.random.default_rng(2).random(1000)
    q.predicted(ids, scores)
    backend.flush()
    assert len(handovers) >= 1000 // joinstore_redis.IDS_PER_PIPELINE
    assert outcome([q.state], ids, [1.0] * 1000) == (1000, [], 0, 0)
    report = q.report()
    assert report["labelled"] == 1000 and report["pending_join"] == 0
    assert q.state.snapshot().recent.tolist() == scores.tolist()


def test_redis_down_is_a_clear_error_and_predictions_wait(redis_server: RedisServer) -> None:
    backend = RedisBackend(redis_server.url, timeout_ms=300)
    q = monitor(backend)
    q.predicted(["a", "b"], np.array([0.2, 0.9]))
    backend.flush()
    redis_server.kill()
    q.predicted(["c"], np.array([0.6]))
    with pytest.raises(StoreUnavailable, match="label join's Redis"):
        backend.flush()
    with pytest.raises(StoreUnavailable):
        join_labels([q.state], ["a"], [0.0])
    with pytest.raises(StoreUnavailable):
        q.report()
    redis_server.restart()  # empty: what was written is gone, what waited is not
    backend.flush()
    assert outcome([q.state], ["c", "a"], [1.0, 0.0]) == (1, ["a"], 0, 0)
    assert q.report()["labelled"] == 1


def test_backend_choice() -> None:
    s = Settings()
    assert join_backend_kind(s) == "memory" and isinstance(join_backend(s), MemoryBackend)
    s.monitoring.quality_path = "x.sqlite"
    assert join_backend_kind(s) == "sqlite"  # what a pool of workers sets
    s.features.store = "redis"
    assert join_backend_kind(s) == "redis"  # replicas on several hosts share it
    s.monitoring.quality_store = "memory"
    assert join_backend_kind(s) == "memory"
    s.monitoring.quality_store = "postgres"
    with pytest.raises(ConfigError, match="auto, memory, sqlite or redis"):
        join_backend_kind(s)
    s.monitoring.quality_store, s.monitoring.quality_path = "sqlite", None
    with pytest.raises(ConfigError, match="quality_path"):
        join_backend_kind(s)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_predictions_waiting_for_a_down_store_are_bounded_and_counted(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if kind == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        backend: Any = RedisBackend(redis.url, timeout_ms=300)
        redis.kill()
    else:
        backend = SqliteBackend(str(tmp_path / "labels.sqlite"))
        backend.db.close()  # the file cannot be written: what a full disk looks like here
    q = monitor(backend, capacity=10, window=5)
    for i in range(40):
        q.predicted([f"r{i}"], np.array([0.5]))
    with pytest.raises(StoreUnavailable):
        backend.flush()
    if kind == "redis":
        redis.restart()
    else:
        backend = SqliteBackend(str(tmp_path / "labels.sqlite"))
        backend.states.append(q.state)
        q.state.backend = backend
    backend.flush()
    snap = q.state.snapshot()
    # 2 x capacity + window (25) waited; the 15 before them were dropped, counted as evicted
    assert snap.pending == 10 and snap.evicted == 30
    assert outcome([q.state], ["r39", "r29", "r0"], [1.0, 1.0, 1.0]) == (1, ["r0"], 1, 0)


def test_one_worker_holds_the_alert_lease_until_it_stops_renewing(backends: Factory) -> None:
    a, b = backends(), backends()
    assert a.leads("alerts", 0.5) and not b.leads("alerts", 0.5)
    assert a.leads("alerts", 0.5) and not b.leads("alerts", 0.5)  # renewed by its holder
    time.sleep(0.7)  # a stopped renewing (a worker that died)
    assert b.leads("alerts", 0.5) and not a.leads("alerts", 0.5)
    assert MemoryBackend().leads("alerts", 0.5)  # one process: always


def test_the_review_queue_is_one_queue_for_every_worker(backends: Factory) -> None:
    """Two workers' review queues over one store: items queued by either are listed by both,
    a reviewer's label takes an item once, the export holds every worker's rows, and the
    capacity bounds the shared queue."""
    qa = ReviewQueue(6000, 5, review_store(backends(), 5))
    qb = ReviewQueue(6000, 5, review_store(backends(), 5))
    for i in range(4):
        assert (qa if i % 2 else qb).offer("m", "1", f"r{i}", ["uncertain"], {"a": i}, 0.5, 0.5)
    assert [i["request_id"] for i in qa.pending()] == ["r0", "r1", "r2", "r3"]
    assert qa.pending() == qb.pending()
    first, second = qa.pending()[:2]
    assert qb.label(first["id"], 1, reviewer="ana")["request_id"] == "r0"
    with pytest.raises(NotFound):
        qa.label(first["id"], 0)  # taken once, whichever worker the reviewer reached
    qa.label(second["id"], 0, reviewer="bo")
    rows = pq.read_table(io.BytesIO(qb.export_parquet())).to_pylist()
    assert [(r["request_id"], r["label"], r["reviewer"]) for r in rows] == [
        ("r0", 1.0, "ana"), ("r1", 0.0, "bo")]
    for i in range(4, 12):
        qa.offer("m", "1", f"r{i}", ["uncertain"], {"a": i}, 0.5, 0.5)
    stats = qb.stats()
    assert stats["waiting"] == 5 and stats["dropped"] == 5 and stats["labelled"] == 2
    assert [i["request_id"] for i in qb.pending()] == [f"r{i}" for i in range(7, 12)]


def test_the_tick_flush_sends_evalsha_without_script_exists(redis_server: RedisServer) -> None:
    """Each tick's write is one pipeline ending in EVALSHA, never a ``SCRIPT EXISTS`` round
    trip first; a Redis that lost the script (flushed, restarted) gets it loaded again."""
    import redis

    backend = RedisBackend(redis_server.url)
    q = monitor(backend)
    probe = redis.Redis.from_url(redis_server.url)
    probe.config_resetstat()
    for i in range(5):
        q.predicted([f"r{i}"], np.array([0.5]))
        backend.flush()
    stats = probe.info("commandstats")
    assert "cmdstat_script|exists" not in stats and "cmdstat_script" not in stats
    assert stats["cmdstat_evalsha"]["calls"] >= 5
    probe.script_flush()  # the script is gone: NOSCRIPT, loaded, sent again
    q.predicted(["late"], np.array([0.7]))
    backend.flush()
    assert probe.script_exists(backend.evict.sha) == [True]
    assert outcome([q.state], ["late", "r0"], [1.0, 0.0]) == (2, [], 0, 0)
