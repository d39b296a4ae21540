"""A small synthetic inference graph: items on a circle, a ranker that prefers expensive ones.

Item ``i{n}``'s embedding points at angle ``n`` (so retrieval from a session's items finds their
neighbours), its ``price`` is a known number and ``in_stock`` is 0 for every tenth item. The
ranker scores ``price`` (weight 1) plus nothing else, so the ranked order differs visibly from the
retrieval order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from onnx import TensorProto, helper, numpy_helper


def linear_onnx(weights: np.ndarray, path: Path, in_name: str = "x") -> None:
    """An ONNX model computing ``x @ weights`` (float32, any batch size)."""
    w = numpy_helper.from_array(weights.astype(np.float32), "w")
    node = helper.make_node("MatMul", [in_name, "w"], ["y"])
    graph = helper.make_graph(
        [node], "linear",
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, [None, weights.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, weights.shape[1]])],
        [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def angle_embeddings(n: int, dim: int = 8) -> np.ndarray:
    angles = np.arange(n) * (2 * np.pi / n)
    emb = np.zeros((n, dim), dtype=np.float32)
    emb[:, 0], emb[:, 1] = np.cos(angles), np.sin(angles)
    return emb


def make_graph(folder: Path, n: int = 200, dim: int = 8, k: int = 20, top_n: int = 5,
               encoder: bool = False, index: str = "exact",
               embeddings: np.ndarray | None = None, ranker_weights: list[float] | None = None,
               **steps: Any) -> Path:
    """Write a graph folder; ``steps`` override whole step mappings (e.g. ``retrieve={...}``)."""
    folder.mkdir(parents=True, exist_ok=True)
    emb = angle_embeddings(n, dim) if embeddings is None else embeddings
    np.save(folder / "items.npy", emb)
    ids = [f"i{j}" for j in range(n)]
    price = (np.arange(n) * 37 % 101).astype(np.float64)
    stock = np.where(np.arange(n) % 10 == 9, 0, 1)
    popularity = np.arange(n, 0, -1).astype(np.float64)  # i0 most popular
    pq.write_table(pa.table({"item_id": ids, "price": price, "in_stock": stock,
                             "popularity": popularity}), folder / "items.parquet")
    features = ["retrieval:score", "item:price", "session:seen"]
    weights = [0.0, 1.0, 0.0] if ranker_weights is None else ranker_weights
    linear_onnx(np.array(weights)[:, None], folder / "ranker.onnx")
    doc: dict[str, Any] = {"steps": [
        {"features": steps.get("features", {"session_items": 10, "fields": ["x0", "x1"]})},
    ]}
    if encoder:
        # the query is (x0, x1, 0, ...): the request fields pick a point on the circle
        w = np.zeros((2, emb.shape[1]))
        w[0, 0] = w[1, 1] = 1.0
        linear_onnx(w, folder / "encoder.onnx")
        doc["steps"].append({"encode": {"model": "encoder.onnx"}})
    doc["steps"] += [
        {"retrieve": steps.get("retrieve", {"k": k, "index": index})},
        {"rank": steps.get("rank", {"model": "ranker.onnx", "features": features})},
        {"rules": steps.get("rules", {"drop_seen": True, "in_stock": "in_stock"})},
    ]
    doc["output"] = {"top_n": top_n}
    (folder / "graph.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder
