"""An inference graph whose ranker is Python (``rank: {model: ranker.py}``): checked at add,
served by the graph's rank step like an ONNX ranker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from redline.errors import InvalidInput, ModelError
from redline.models import ModelRepository
from tests.pipeline.conftest import make_settings
from tests.pipeline.graphs import make_graph
from tests.serving.helpers import ServerThread

pytestmark = pytest.mark.slow  # worker processes and a server

FEATURES = ["retrieval:score", "item:price", "session:seen"]
RANKER = '''
import numpy as np


class Ranker:
    inputs = {"x": ("FP32", [-1, 3])}
    outputs = {"score": ("FP32", [-1])}

    def predict(self, inputs):
        return {"score": inputs["x"][:, 1] * np.float32(PRICE_WEIGHT)}
'''


def python_graph(folder: Path, ranker: str = RANKER, weight: float = 1.0) -> Path:
    make_graph(folder, rank={"model": "ranker.py", "features": FEATURES})
    (folder / "ranker.py").write_text(f"PRICE_WEIGHT = {weight!r}\n" + ranker)
    return folder


def test_a_python_ranker_is_checked_at_add(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path / "models")
    folder = python_graph(tmp_path / "g")
    with pytest.raises(InvalidInput, match="rank step's model .*ranker.py is Python"):
        repo.add_graph("rec", folder)
    meta = repo.add_graph("rec", folder, trust_code=True)
    assert meta.framework == "graph" and "graph" in meta.extra and "python" in meta.extra
    version = repo.version_dir("rec", 1)
    assert {"model.py", "graph.yaml", "items.npy", "items.parquet", "sample.npz"} <= {
        p.name for p in version.iterdir()}
    assert json.loads((version / "metadata.json").read_text())["feature_names"] == FEATURES
    broken = python_graph(tmp_path / "b", RANKER.replace('inputs["x"][:, 1]',
                                                         'inputs["x"][:, 1] / 0 * 0'))
    with pytest.raises(ModelError, match=r"ranker\.py: .*holds NaN"):
        repo.add_graph("bad", broken, trust_code=True)


def test_a_python_ranker_serves_the_graph(tmp_path: Path, defs_path: Path) -> None:
    repo = ModelRepository(tmp_path / "models")
    repo.add_graph("rec", python_graph(tmp_path / "g"), trust_code=True)
    server = ServerThread(make_settings(tmp_path / "models", defs_path)).start()
    try:
        r = httpx.post(f"{server.http}/v1/models/rec/predict",
                       json={"session_id": "new", "request": {}}, timeout=10)
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        assert doc["path"] == "primary" and not doc["degraded"]
        scores = [i["score"] for i in doc["items"]]
        assert len(scores) == 5 and scores == sorted(scores, reverse=True)  # by price
        assert {"rank", "inference"} <= set(doc["timings_us"])
    finally:
        server.stop()
