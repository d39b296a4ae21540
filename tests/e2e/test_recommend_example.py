"""The recommender example at a small size: generate, train both stages, evaluate, artifacts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pandas as pd
import pytest
import yaml

from redline.models import ModelRepository
from tests.pipeline.conftest import make_settings, serve  # noqa: F401 - the server fixture

pytestmark = pytest.mark.slow  # seconds of training: not in test-fast

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "recommend"


# The example's modules have the plain names the fraud example's have too (generate, features,
# ...): a test worker that imported those first must not hand them to this example.
MODULES = ("generate", "replay", "train", "features", "embeddings", "ranking", "metrics")


@pytest.fixture(scope="module")
def example():
    saved = {name: sys.modules.pop(name) for name in MODULES if name in sys.modules}
    sys.path.insert(0, str(EXAMPLE))
    try:
        import generate
        import replay
        import train

        yield generate, train, replay
    finally:
        sys.path.remove(str(EXAMPLE))
        for name in MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def test_recommend_example_end_to_end(example, tmp_path, serve):  # noqa: F811
    """Generate, train both stages, add the graph, serve it, replay held-out sessions."""
    generate, train, replay = example
    data = generate.generate(items=2000, users=500, days=4, seed=3, categories=8,
                             styles_per_category=6)
    assert len(data.items) == 2000
    assert {e["type"] for e in data.events} == {"click", "add_to_cart"}
    assert all(a["ts"] <= b["ts"] for a, b in zip(data.events[:-1], data.events[1:],
                                                  strict=True))
    generate.write(data, tmp_path / "data")
    again = generate.read(tmp_path / "data")
    assert again.events == data.events and again.items == data.items

    result = train.train(again, tmp_path / "art", holdout_days=1.0, epochs=4, trees=20,
                         max_rank_requests=300, max_eval_requests=300, candidates=30)
    assert result["holdout_requests"] > 150
    # Learning pays: both stages find the next click far more often than popularity does.
    assert result["retrieval_recall_at_10"] > 2 * result["popularity_recall_at_10"]
    assert result["ranked_recall_at_10"] > 2 * result["popularity_recall_at_10"]
    assert result["ranked_ndcg_at_10"] > result["popularity_ndcg_at_10"]

    art = tmp_path / "art"
    items = np.load(art / "items.npy")
    catalogue = pd.read_parquet(art / "items.parquet")
    assert items.shape == (2000, 32) and items.dtype == np.float32
    assert list(catalogue["item_id"][:3]) == ["i0", "i1", "i2"]
    assert (catalogue["popularity"] > 0).all()
    # The graph's query is the recency-weighted sum of the session's rows: the retrieval the
    # offline figures measured is the one the server runs.
    q = train.embeddings.queries(items, [[5, 7]])[0]
    assert np.allclose(q, items[5] + 0.8 * items[7], atol=1e-6)
    ranker = ort.InferenceSession(str(art / "ranker.onnx"))
    width = len(train.ranking.RANK_FEATURES)
    scores = ranker.run(None, {"candidates": np.zeros((30, width), np.float32)})[0]
    assert scores.shape[0] == 30
    graph = yaml.safe_load((art / "graph.yaml").read_text())
    rank = next(s["rank"] for s in graph["steps"] if "rank" in s)
    assert rank["features"] == train.ranking.RANK_FEATURES
    assert {"retrieve": {"k": 30}} in graph["steps"]

    meta = ModelRepository(tmp_path / "models").add_graph("recommend", art)
    assert meta.extra["catalogue"]["items"] == 2000
    srv = serve(make_settings(tmp_path / "models", EXAMPLE / "features.py"))
    sessions = replay.held_out_sessions(again, 1.0, 30)
    records = replay.replay(srv.http, again, sessions)
    assert len(records) > 40
    assert not any(r["degraded"] for r in records)
    online = float(np.mean([r["hit"] for r in records]))
    # Online, the graph finds the next click as the offline figures said it would (the
    # session items and user windows reach it), far above popularity.
    assert online > 2 * result["popularity_recall_at_10"], online


def test_without_pytorch_the_example_says_how_to_install_it(tmp_path):
    """`make demo`'s environment has no PyTorch: train.py and run.sh stop before any work with
    one line naming the install command, not a traceback."""
    import os
    import shutil
    import subprocess

    folder = tmp_path / "recommend"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("data", "artifacts",
                                                                   ".redline"))
    blocked = tmp_path / "no-torch" / "torch"
    blocked.mkdir(parents=True)  # an environment without PyTorch, whatever this one has
    (blocked / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    env = {**os.environ, "PYTHONPATH": str(blocked.parent),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "ITEMS": "200", "USERS": "50", "SESSIONS": "5"}
    for argv in ([sys.executable, "train.py", "--data", "data"], ["bash", "run.sh"]):
        proc = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=120)
        err = proc.stderr.strip()
        assert proc.returncode != 0, (argv, proc.stdout, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert "pip install -e '.[torch]'" in err and "make demo" in err, (argv, err)
        assert not (folder / "data").exists(), argv  # stopped before generating anything


def test_replay_sends_events_again_on_a_503(example) -> None:
    """``POST /v1/events`` answers 503 when the store did not take the events (nothing applied,
    the sender retries): the replay sends them again, a few times, then reports the 503."""
    import http.server
    import threading

    import httpx

    _, _, replay = example
    posts: list[bytes] = []

    class Events(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        unavailable = 1  # how many posts get the 503

        def do_POST(self) -> None:  # noqa: N802 - the http.server naming
            posts.append(self.rfile.read(int(self.headers["content-length"])))
            busy = len(posts) <= Events.unavailable
            body = b'{"code": "store_unavailable"}' if busy else b'{"accepted": 1}'
            self.send_response(503 if busy else 200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Events)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}") as client:
            assert replay.post_events(client, b'{"e": 1}').status_code == 200
            assert posts == [b'{"e": 1}'] * 2
            posts.clear()
            Events.unavailable = 100
            assert replay.post_events(client, b'{"e": 2}').status_code == 503
            assert len(posts) == 5
    finally:
        server.shutdown()
        server.server_close()
