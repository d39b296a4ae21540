"""The work every server of the Python-model comparison does, in numpy alone.

Imported by redline's models and by every peer's (Triton's Python backend, MLServer's custom
runtime, Ray Serve's deployments), each from its own environment, so it needs numpy and nothing
else; the middle step of the graph is an ONNX file each server runs with ONNX Runtime.

- **rowsum**, a Python model that does no work: ``OUTPUT0 = INPUT0.sum(axis=1)`` for an
  ``INPUT0`` of ``[n, 16]`` FP32.
- **The three-step graph**: a Python featurizer (``FEATURES``: signed ``log1p`` of the inputs,
  standardized) → an MLP in ONNX (16 → 32 → 2, softmax: ``PROBS``) → a Python post-step
  (``LABEL`` INT64: whether the positive class passes ``THRESHOLD``, ``SCORE`` FP32: its
  probability). Its constants and weights come from a fixed seed (``constants``), so every
  server computes the same answer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

WIDTH = 16  # columns of INPUT0
HIDDEN = 32
THRESHOLD = np.float32(0.5)
CONSTANTS = "graph_constants.npz"  # the featurizer's mean and scale, beside each step's code
ONNX_FILE = "mlp.onnx"


def rowsum(x: np.ndarray) -> np.ndarray:
    return x.sum(axis=1, dtype=np.float32)


def constants(seed: int = 7) -> dict[str, np.ndarray]:
    """The featurizer's mean and scale and the MLP's weights, the same everywhere."""
    rng = np.random.default_rng(seed)
    return {"mean": rng.normal(0, 0.1, WIDTH).astype(np.float32),
            "scale": rng.uniform(0.5, 2.0, WIDTH).astype(np.float32),
            "w1": rng.normal(0, 0.5, (WIDTH, HIDDEN)).astype(np.float32),
            "b1": rng.normal(0, 0.1, HIDDEN).astype(np.float32),
            "w2": rng.normal(0, 0.5, (HIDDEN, 2)).astype(np.float32),
            "b2": rng.normal(0, 0.1, 2).astype(np.float32)}


def load_constants(folder: Path | str) -> dict[str, np.ndarray]:
    with np.load(Path(folder) / CONSTANTS) as npz:
        return {k: npz[k] for k in npz.files}


def featurize(x: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Signed log1p, standardized: the Python step before the model."""
    return ((np.sign(x) * np.log1p(np.abs(x)) - mean) * scale).astype(np.float32, copy=False)


def post(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Python step after the model: the positive class's probability and its label."""
    score = np.ascontiguousarray(probs[:, 1], dtype=np.float32)
    return (score >= THRESHOLD).astype(np.int64), score


def reference(x: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's answer in numpy, to check each server's."""
    c = constants()
    h = np.maximum(featurize(x, c["mean"], c["scale"]) @ c["w1"] + c["b1"], 0)
    z = h @ c["w2"] + c["b2"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    label, score = post(e / e.sum(axis=1, keepdims=True))
    return {"LABEL": label, "SCORE": score}


def write_files(folder: Path | str) -> Path:
    """The featurizer's constants (``graph_constants.npz``) and the MLP (``mlp.onnx``) into
    ``folder``; needs the ``onnx`` package (redline's environment has it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = constants()
    np.savez(folder / CONSTANTS, mean=c["mean"], scale=c["scale"])
    inits = [numpy_helper.from_array(c[k], k) for k in ("w1", "b1", "w2", "b2")]
    nodes = [helper.make_node("Gemm", ["FEATURES", "w1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["PROBS"], axis=1)]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("FEATURES", TensorProto.FLOAT,
                                                     ["n", WIDTH])],
        [helper.make_tensor_value_info("PROBS", TensorProto.FLOAT, ["n", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, folder / ONNX_FILE)
    return folder / ONNX_FILE


def rowsum_onnx(path: Path | str) -> Path:
    """rowsum as an ONNX model (``ReduceSum`` over the columns): redline's ONNX path of the
    same signature."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    node = helper.make_node("ReduceSum", ["INPUT0", "axes"], ["OUTPUT0"], keepdims=0)
    graph = helper.make_graph(
        [node], "rowsum", [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT,
                                                         ["n", WIDTH])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["n"])], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return Path(path)
