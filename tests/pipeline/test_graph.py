"""Inference graphs: refused at ``models add`` when broken, served on ``/v1`` (REST and gRPC)
with session items, retrieval, ranking and rules as stages (timings, metrics, trace spans),
degraded to the retrieval order when the budget cannot fit the ranker and to the popularity
order when it cannot fit retrieval."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest

from redline.errors import InvalidInput
from redline.models import ModelRepository
from redline.proto import redline_v1_pb2 as v1
from redline.proto import redline_v1_pb2_grpc as v1_grpc
from tests.pipeline.conftest import ServerThread, make_settings
from tests.pipeline.graphs import make_graph


@pytest.mark.parametrize(("change", "message"), [
    ("empty", "the catalogue is empty"),
    ("dim", "has dimension 8"),
    ("k", "retrieve.k (500) is larger than the catalogue (200 items)"),
    ("step", "unknown step 'score'"),
    ("column", "names no numeric column"),
])
def test_add_refuses_broken_graphs(tmp_path: Path, change: str, message: str) -> None:
    kwargs: dict[str, Any] = {"encoder": change == "dim"}
    if change == "empty":
        kwargs.update(n=0, embeddings=np.zeros((0, 8), np.float32))
    if change == "k":
        kwargs["k"] = 500
    if change == "column":
        kwargs["rank"] = {"model": "ranker.onnx", "features": ["item:colour"]}
    folder = make_graph(tmp_path / "g", **kwargs)
    if change == "dim":  # embeddings of dimension 8, an encoder answering 4 columns
        np.save(folder / "items.npy", np.ones((200, 8), np.float32))
        from tests.pipeline.graphs import linear_onnx

        linear_onnx(np.ones((2, 4)), folder / "encoder.onnx")
    if change == "step":
        text = (folder / "graph.yaml").read_text().replace("rules:", "score:")
        (folder / "graph.yaml").write_text(text)
    repo = ModelRepository(tmp_path / "repo")
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        repo.add_graph("rec", folder)
    assert repo.list_models() == []  # nothing half-added


@pytest.mark.slow
def test_ann_index_built_at_add_with_recall(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(3000, 16)).astype(np.float32)
    folder = make_graph(tmp_path / "g", n=3000, dim=16, k=50, index="hnsw", embeddings=emb)
    meta = ModelRepository(tmp_path / "repo").add_graph("rec", folder)
    info = meta.extra["catalogue"]
    assert info["index"] == "hnsw" and info["items"] == 3000 and info["dim"] == 16
    assert info["recall_at_k"] >= 0.95
    assert (tmp_path / "repo" / "rec" / "1" / "items.faiss").is_file()


def test_the_docs_name_the_item_count_that_gets_an_ann_index() -> None:
    from redline.models.graph import ANN_MIN_ITEMS

    root = Path(__file__).resolve().parents[2]
    shown = f"{ANN_MIN_ITEMS:,}"
    assert f"`auto` builds the index for {shown} items or more" in (
        root / "docs" / "recommend.md").read_text()
    assert f"keeps exact search below {shown} items" in " ".join(
        (root / "docs" / "performance.md").read_text().split())


@pytest.fixture(scope="module")
def graph_server(tmp_path_factory: pytest.TempPathFactory, defs_path: Path) -> Any:
    root = tmp_path_factory.mktemp("graph")
    repo = ModelRepository(root / "models")
    repo.add_graph("rec", make_graph(root / "g"))
    repo.add_graph("enc", make_graph(root / "e", encoder=True))
    rng = np.random.default_rng(2)
    repo.add_graph("big", make_graph(root / "b", n=3000, dim=16, k=50, index="hnsw",
                                     embeddings=rng.normal(size=(3000, 16)).astype(np.float32)))
    repo.add_graph("ent", make_graph(
        root / "u", ranker_weights=[1.0, 100.0],
        features={"session_items": 10, "entity": ["card_txn:count_1h"]},
        rank={"model": "ranker.onnx", "features": ["item:price", "entity:card_txn:count_1h"]}))
    srv = ServerThread(make_settings(root / "models", defs_path)).start()
    yield srv
    srv.stop()
    shutil.rmtree(root, ignore_errors=True)


def _predict(srv: Any, model: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{srv.http}/v1/models/{model}/predict", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow
def test_graph_answers_cold_start_then_follows_the_session(graph_server: Any) -> None:
    cold = _predict(graph_server, "rec", {"session_id": "never-seen", "request": {}})
    # no items, no encoder: the popularity order (i0 first), ranked by price, out of stock gone
    assert cold["degraded"] is False and cold["path"] == "primary"
    assert cold["retrieved"] == 20
    ids = [i["item_id"] for i in cold["items"]]
    assert len(ids) == 5 and all(int(i[1:]) < 20 and int(i[1:]) % 10 != 9 for i in ids)
    prices = [i["score"] for i in cold["items"]]
    assert prices == sorted(prices, reverse=True)  # the ranker's order: price
    for stage in ("sessions", "query", "retrieve", "rank", "inference", "rules"):
        assert stage in cold["timings_us"], cold["timings_us"]

    sid = "g-session-1"
    r = httpx.post(f"{graph_server.http}/v1/sessions/{sid}/events", timeout=10,
                   json=[{"item_id": "i100", "type": "click", "ts_ms": 1_000},
                         {"item_id": "i101", "type": "click", "ts_ms": 2_000}])
    assert r.status_code == 200, r.text
    warm = _predict(graph_server, "rec", {"session_id": sid, "request": {}})
    ids = [i["item_id"] for i in warm["items"]]
    # neighbours of i100/i101 on the circle, never the seen ones, never out of stock
    assert ids and all(abs(int(i[1:]) - 100) <= 15 for i in ids), ids
    assert "i100" not in ids and "i101" not in ids and "i109" not in ids
    # each step is a stage of the /metrics histograms too (folded on the monitor's tick)
    deadline = time.monotonic() + 10
    wanted = {"sessions", "query", "retrieve", "rank", "rules"}
    while True:
        text = httpx.get(f"{graph_server.http}/metrics", timeout=10).text
        found = {line.split('stage="')[1].split('"')[0] for line in text.splitlines()
                 if line.startswith("redline_stage_duration_seconds_count")
                 and 'model="rec"' in line and 'stage="' in line}
        if wanted <= found or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert wanted <= found, found


@pytest.mark.slow
def test_encoder_and_ann_graphs_serve(graph_server: Any) -> None:
    # the encoder turns (x0, x1) = (cos, sin) of item 50's angle into the query
    a = 50 * 2 * np.pi / 200
    doc = _predict(graph_server, "enc", {"request": {"x0": float(np.cos(a)),
                                                      "x1": float(np.sin(a))}})
    ids = [int(i["item_id"][1:]) for i in doc["items"]]
    assert ids and all(abs(i - 50) <= 10 for i in ids), ids
    big = _predict(graph_server, "big", {"session_id": "nobody", "request": {}})
    assert big["retrieved"] == 50 and len(big["items"]) == 5


@pytest.mark.slow
def test_budget_too_small_for_the_ranker_answers_retrieval_order(graph_server: Any) -> None:
    body = {"session_id": "g-budget", "request": {}}
    _predict(graph_server, "rec", body)  # the ranker's latency is known after a run
    for _ in range(20):  # a probe may run the ranker anyway; the next request degrades
        doc = _predict(graph_server, "rec", {**body, "budget_ms": 0.001})
        if doc["degraded"]:
            break
    assert doc["degraded"] is True and doc["path"] == "fallback"
    assert "answered in retrieval order" in doc["degraded_reasons"][0]
    assert "rank" not in doc["timings_us"] and "retrieve" in doc["timings_us"]
    # the popularity order itself: i0, i1, ... (out-of-stock i9 dropped)
    assert [i["item_id"] for i in doc["items"]] == ["i0", "i1", "i2", "i3", "i4"]


@pytest.mark.slow
def test_budget_too_small_for_retrieval_answers_popularity_order(graph_server: Any) -> None:
    sid = "g-retrieval-budget"
    r = httpx.post(f"{graph_server.http}/v1/sessions/{sid}/events", timeout=10,
                   json={"item_id": "i100", "type": "click", "ts_ms": 1_000})
    assert r.status_code == 200, r.text
    body = {"session_id": sid, "request": {}}
    near = _predict(graph_server, "rec", body)  # retrieval's latency is known after a run
    assert near["degraded"] is False
    assert all(abs(int(i["item_id"][1:]) - 100) <= 15 for i in near["items"])
    for _ in range(20):  # a probe may run retrieval anyway; the next request degrades
        doc = _predict(graph_server, "rec", {**body, "budget_ms": 0.001})
        if any("retrieval p99" in reason for reason in doc["degraded_reasons"]):
            break
    assert doc["degraded"] is True and doc["path"] == "fallback"
    assert "candidates in popularity order" in doc["degraded_reasons"][0], doc
    assert "retrieve" not in doc["timings_us"] and "query" not in doc["timings_us"]
    assert "rules" in doc["timings_us"]
    # the popularity candidates (i0..i19), not the neighbours of the click
    ids = [int(i["item_id"][1:]) for i in doc["items"]]
    assert len(ids) == 5 and all(i < 20 for i in ids), ids
    # a budget that fits searches again
    again = _predict(graph_server, "rec", {**body, "budget_ms": 5000})
    assert again["degraded"] is False and "retrieve" in again["timings_us"]


TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
GRAPH_STEPS = ["features", "sessions", "query", "retrieve", "rank", "rules"]


def _stages_in_metrics(srv: Any, model: str, wanted: set[str]) -> set[str]:
    """The stages of ``model`` in the /metrics histograms (folded on the monitor's tick)."""
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(f"{srv.http}/metrics", timeout=10).text
        found = {line.split('stage="')[1].split('"')[0] for line in text.splitlines()
                 if line.startswith("redline_stage_duration_seconds_count")
                 and f'model="{model}"' in line and 'stage="' in line}
        if wanted <= found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.slow
def test_each_graph_step_is_a_span_a_timing_and_a_metric(graph_server: Any) -> None:
    from tests.monitoring.otlp import MemorySink

    sink = MemorySink()
    graph_server.server.monitor.use_trace_exporter(sink)
    sid = "g-traced"
    r = httpx.post(f"{graph_server.http}/v1/sessions/{sid}/events", timeout=10,
                   json={"item_id": "i30", "type": "click", "ts_ms": 1_000})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{graph_server.http}/v1/models/ent/predict", timeout=10,
                   headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
                   json={"session_id": sid, "entities": {"card_id": "u-traced"},
                         "request": {}, "request_id": "graph-traced"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["degraded"] is False
    for step in GRAPH_STEPS:
        assert step in doc["timings_us"], doc["timings_us"]
    deadline = time.monotonic() + 15
    root = None
    while root is None and time.monotonic() < deadline:
        root = next((s for s in list(sink.spans)
                     if s.attributes.get("redline.request_id") == "graph-traced"), None)
        time.sleep(0.1)
    assert root is not None, "the request's spans were not exported"
    assert root.name == "redline v1 ent" and root.trace_id == TRACE and root.parent == PARENT
    children = [s for s in sink.spans if s.trace_id == TRACE and s.parent == root.span_id]
    names = [s.name for s in sorted(children, key=lambda s: s.start)]
    for step in GRAPH_STEPS:
        assert names.count(step) == 1, names
    # in the order the steps ran, inside the request's span
    assert [n for n in names if n in GRAPH_STEPS] == GRAPH_STEPS
    assert all(root.start <= s.start <= s.end <= root.end for s in children)
    # the ranker's run is its queue and inference spans, after the rank rows
    assert names.index("inference") > names.index("rank")
    found = _stages_in_metrics(graph_server, "ent", set(GRAPH_STEPS))
    assert set(GRAPH_STEPS) <= found, found


@pytest.mark.slow
def test_graph_over_grpc_and_bad_requests(graph_server: Any) -> None:
    async def call() -> Any:
        async with grpc.aio.insecure_channel(graph_server.grpc) as channel:
            stub = v1_grpc.PredictionServiceStub(channel)
            return await stub.Predict(v1.PredictRequest(
                model_name="rec", session_id="g-grpc", instances=[v1.Instance()]))

    resp = asyncio.run(call())
    assert resp.retrieved == 20 and len(resp.items) == 5 and resp.items[0].item_id
    assert "retrieve" in resp.timings_us
    r = httpx.post(f"{graph_server.http}/v1/models/rec/predict", timeout=10,
                   json={"instances": [{"request": {}}, {"request": {}}]})
    assert r.status_code == 400 and "one instance" in r.text


@pytest.mark.slow
def test_entity_features_reach_the_ranker(graph_server: Any) -> None:
    ts = int(time.time() * 1000)
    lines = b"\n".join(orjson.dumps({"card_id": "u-graph", "amount": 5.0, "ts": ts - i})
                       for i in range(2))
    r = httpx.post(f"{graph_server.http}/v1/events", content=lines, timeout=10)
    assert r.status_code < 300, r.text
    known = _predict(graph_server, "ent", {"entities": {"card_id": "u-graph"}, "request": {}})
    unknown = _predict(graph_server, "ent", {"entities": {"card_id": "nobody"}, "request": {}})
    assert "features" in known["timings_us"]
    assert [i["item_id"] for i in known["items"]] == [i["item_id"] for i in unknown["items"]]
    # the user's 2 events in the last hour, times the ranker's weight of 100
    assert known["items"][0]["score"] - unknown["items"][0]["score"] == pytest.approx(200.0)


def test_cli_adds_a_graph_folder_and_refuses_a_broken_one(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from tests.models.test_cli import run

    repo = str(tmp_path / "repo")
    code, out, _ = run(capsys, "models", "add", "-m", "rec", str(make_graph(tmp_path / "g")),
                       "--repository", repo)
    assert code == 0 and "added graph rec version 1 (200 items x 8, exact retrieval)" in out
    code, out, err = run(capsys, "models", "add", "-m", "rec",
                         str(make_graph(tmp_path / "b", k=500)), "--repository", repo)
    assert code != 0 and "lower k to at most 200" in out + err
    assert ModelRepository(repo).versions("rec") == [1]


@pytest.mark.slow
def test_a_click_on_one_replica_changes_the_next_answer_on_another(
        tmp_path: Path, defs_path: Path, redis_server_module: Any) -> None:
    repo = ModelRepository(tmp_path / "models")
    repo.add_graph("rec", make_graph(tmp_path / "g"))
    url = redis_server_module.url
    a, b = (ServerThread(make_settings(tmp_path / "models", defs_path, store="redis",
                                       redis_url=url)).start() for _ in range(2))
    try:
        sid = f"replicas-{time.monotonic_ns()}"
        before = _predict(b, "rec", {"session_id": sid, "request": {}})
        r = httpx.post(f"{a.http}/v1/sessions/{sid}/events", timeout=10,
                       json={"item_id": "i150", "type": "click", "ts_ms": 1_000})
        assert r.status_code == 200, r.text
        after = _predict(b, "rec", {"session_id": sid, "request": {}})
        ids = [i["item_id"] for i in after["items"]]
        assert ids != [i["item_id"] for i in before["items"]]
        assert "i150" not in ids and all(abs(int(i[1:]) - 150) <= 15 for i in ids), ids
    finally:
        a.stop()
        b.stop()


@pytest.mark.slow
def test_a_slow_session_store_degrades_within_the_budget_then_recovers(
        tmp_path: Path, defs_path: Path, redis_server: Any) -> None:
    """Redis paused (SIGSTOP) behind a 2 s socket timeout: the session read stops waiting when
    the request's budget says so, the answer comes on time, degraded with the reason, and once
    Redis answers again the session's items steer the answer again."""
    import signal

    repo = ModelRepository(tmp_path / "models")
    repo.add_graph("rec", make_graph(tmp_path / "g"))
    settings = make_settings(tmp_path / "models", defs_path, store="redis",
                             redis_url=redis_server.url)
    settings.features.redis_timeout_ms = 2000.0
    settings.pipeline.breaker_reset_ms = 200
    srv = ServerThread(settings).start()
    try:
        sid = f"slow-{time.monotonic_ns()}"
        r = httpx.post(f"{srv.http}/v1/sessions/{sid}/events", timeout=10,
                       json={"item_id": "i150", "type": "click", "ts_ms": 1_000})
        assert r.status_code == 200, r.text
        body = {"session_id": sid, "request": {}, "budget_ms": 30}
        near = _predict(srv, "rec", body)
        assert not near["degraded"] and all(
            abs(int(i["item_id"][1:]) - 150) <= 15 for i in near["items"]), near
        redis_server.proc.send_signal(signal.SIGSTOP)
        try:
            docs, waited = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                docs.append(_predict(srv, "rec", body))
                waited.append(time.perf_counter() - t0)
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        assert all(d["degraded"] for d in docs), docs
        assert "session store slow" in docs[0]["degraded_reasons"][0], docs[0]
        assert all("session" in d["degraded_reasons"][0] for d in docs), docs
        assert max(waited) < 0.5, waited  # the 30 ms budget, not the 2 s socket timeout
        # Server-side: the read ends at the budget (slack for timer wake-ups on a busy CPU).
        assert all(d["timings_us"]["total"] < 60_000 for d in docs), [
            d["timings_us"] for d in docs]
        deadline = time.monotonic() + 10
        while True:  # the breaker lets a request through again and the session steers it
            doc = _predict(srv, "rec", body)
            if not doc["degraded"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not doc["degraded"], doc
        assert [i["item_id"] for i in doc["items"]] == [i["item_id"] for i in near["items"]]
    finally:
        srv.stop()
