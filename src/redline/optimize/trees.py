"""Fewer trees: keep the first K trees of an ONNX tree ensemble.

Works on the ``TreeEnsembleClassifier``/``TreeEnsembleRegressor`` operators that scikit-learn,
LightGBM and XGBoost models all convert to. Averaging ensembles (random forests) store each
tree's leaf weights pre-divided by the number of trees, so the kept weights must be scaled by
N/K; boosted ensembles add trees and usually must not be. Which one a graph is cannot be read
off it reliably, so both are tried on the tuning split and the one closer to the original's
outputs is kept (for a boosted model scaling can win too: it extends the early trees' push).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from redline.optimize.candidates import Candidate, Skipped, TuneContext
from redline.optimize.profile import ModelRunner

ENSEMBLE_OPS = ("TreeEnsembleClassifier", "TreeEnsembleRegressor")
FRACTIONS = (0.5, 0.25, 0.1)


def _ensemble(model: onnx.ModelProto) -> onnx.NodeProto | None:
    for node in model.graph.node:
        if node.op_type in ENSEMBLE_OPS:
            return node
    return None


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def _values(attr: onnx.AttributeProto) -> np.ndarray:
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    value = helper.get_attribute_value(attr)
    return np.asarray(value, dtype=object if value and isinstance(value[0], bytes) else None)


def _set(node: onnx.NodeProto, attr: onnx.AttributeProto, values: np.ndarray) -> None:
    if attr.type == onnx.AttributeProto.TENSOR:
        new = helper.make_attribute(attr.name, numpy_helper.from_array(values.astype(
            numpy_helper.to_array(attr.t).dtype)))
    elif attr.type == onnx.AttributeProto.FLOATS:
        new = helper.make_attribute(attr.name, [float(v) for v in values])
    elif attr.type == onnx.AttributeProto.INTS:
        new = helper.make_attribute(attr.name, [int(v) for v in values])
    else:
        new = helper.make_attribute(attr.name, list(values))
    attr.CopyFrom(new)


def n_trees(model: onnx.ModelProto) -> int:
    node = _ensemble(model)
    if node is None:
        return 0
    ids = _attr(node, "nodes_treeids")
    return len(np.unique(_values(ids))) if ids is not None else 0


def keep_trees(data: bytes, k: int, scale: float) -> bytes:
    """The model with only its first ``k`` trees, leaf weights multiplied by ``scale``."""
    model = onnx.load_from_string(data)
    node = _ensemble(model)
    assert node is not None
    tree_ids = _values(_attr(node, "nodes_treeids"))  # type: ignore[arg-type]
    kept = set(np.unique(tree_ids)[:k].tolist())
    node_mask = np.isin(tree_ids, list(kept))
    prefix = "class_" if node.op_type == "TreeEnsembleClassifier" else "target_"
    leaf_ids = _values(_attr(node, f"{prefix}treeids"))  # type: ignore[arg-type]
    leaf_mask = np.isin(leaf_ids, list(kept))
    for attr in list(node.attribute):
        base = attr.name.removesuffix("_as_tensor")
        if base.startswith("nodes_"):
            _set(node, attr, _values(attr)[node_mask])
        elif base.startswith(prefix) and base != f"{prefix}labels":
            values = _values(attr)[leaf_mask]
            if base.endswith("weights"):
                values = values.astype(np.float64) * scale
            _set(node, attr, values)
    return model.SerializeToString()


def tree_candidates(model: bytes, ctx: TuneContext,
                    fractions: tuple[float, ...] = FRACTIONS) -> Iterator[Candidate | Skipped]:
    proto = onnx.load_from_string(model)
    total = n_trees(proto)
    if total == 0:
        if any(n.op_type == "TreeEnsemble" for n in proto.graph.node):
            yield Skipped("trees", "trees", "the ai.onnx.ml 5 TreeEnsemble operator is not "
                          "supported yet; convert with ai.onnx.ml opset 3")
        else:
            yield Skipped("trees", "trees", "not a tree ensemble")
        return
    seen = set()
    for fraction in fractions:
        k = max(1, int(round(total * fraction)))
        if k >= total or k in seen:
            continue
        seen.add(k)
        best: tuple[float, float, bytes] | None = None
        for scale in (1.0, total / k):
            trimmed = keep_trees(model, k, scale)
            out = ModelRunner(trimmed, task=ctx.task, class_labels=ctx.class_labels,
                              name="trees").predict(ctx.x)
            diff = float(np.mean(np.abs(out.scores - ctx.teacher.scores)))
            if best is None or diff < best[0]:
                best = (diff, scale, trimmed)
        assert best is not None
        _, scale, trimmed = best
        yield Candidate(
            f"trees-{k}of{total}", "trees", trimmed,
            recipe={"kept_trees": k, "total_trees": total,
                    "weights_scaled": scale != 1.0, "scale": round(scale, 6)},
            note=f"first {k} of {total} trees" + (f", leaf weights x{scale:.3g}"
                                                   if scale != 1.0 else ", weights as trained"),
        )
