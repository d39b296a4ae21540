"""Candidate models for rollout tests: same interface as ``affine_model`` (x[N,4] -> y, s)."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _io() -> tuple[list, list]:  # type: ignore[type-arg]
    return ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4]),
             helper.make_tensor_value_info("s", TensorProto.FLOAT, [None])])


def _model(nodes, inits) -> bytes:  # type: ignore[no-untyped-def]
    inputs, outputs = _io()
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _tail(y_in: str) -> tuple[list, list]:  # type: ignore[type-arg]
    nodes = [helper.make_node("Identity", [y_in], ["y"]),
             helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0)]
    return nodes, [numpy_helper.from_array(np.array([1], np.int64), "axes")]


def slow_affine(scale: float = 2.0, layers: int = 150, width: int = 512) -> bytes:
    """``y = x * scale`` like ``affine_model``, plus ``layers`` data-dependent matmuls (ms)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Mul", ["x", "k"], ["m"]),
             helper.make_node("MatMul", ["x", "w0"], ["h0"])]
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [f"h{i}", "w"], [f"p{i}"]))
        nodes.append(helper.make_node("Tanh", [f"p{i}"], [f"h{i + 1}"]))
    nodes += [helper.make_node("ReduceSum", [f"h{layers}"], ["r"], keepdims=1),
              helper.make_node("Mul", ["r", "zero"], ["z"]),
              helper.make_node("Add", ["m", "z"], ["yy"])]
    tail, tail_inits = _tail("yy")
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "k"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(rng.normal(0, 0.05, (4, width)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.normal(0, 0.05, (width, width)).astype(np.float32),
                                     "w")]
    return _model(nodes + tail, inits + tail_inits)


def failing_affine(scale: float = 2.0) -> bytes:
    """``y = x * scale``, but any row whose largest value is 3 or more fails inside the model
    (a Gather index out of range): warm-up (small values) passes, real traffic errors."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], axes=[1], keepdims=0),
             helper.make_node("Cast", ["mx"], ["idx"], to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "idx"], ["g"]),
             helper.make_node("Unsqueeze", ["g", "axes"], ["g2"]),
             helper.make_node("Mul", ["x", "g2"], ["yy"])]
    tail, tail_inits = _tail("yy")
    inits = [numpy_helper.from_array(np.array([scale] * 3, np.float32), "table")]
    return _model(nodes + tail, inits + tail_inits)


def constant_affine(value: float = 0.5) -> bytes:
    """Fast and error-free, but every answer is the same: ``y = value``, ``s = 4 * value``."""
    nodes = [helper.make_node("Mul", ["x", "zero"], ["z"]),
             helper.make_node("Add", ["z", "c"], ["y"]),
             helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0)]
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(value, np.float32), "c"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    return _model(nodes, inits)


def negated_affine(scale: float = 2.0) -> bytes:
    """``y = -x * scale``, ``s = -sum(x)``: on inputs symmetric about 0 its answers have the
    baseline's distribution, yet each one is wrong (only labels show it)."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["y"]),
             helper.make_node("ReduceSum", ["x", "axes"], ["r"], keepdims=0),
             helper.make_node("Neg", ["r"], ["s"])]
    inits = [numpy_helper.from_array(np.array(-scale, np.float32), "k"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    return _model(nodes, inits)


def write_stats_now(controller: Any) -> None:
    """``controller.refresh(force=True)``, writing this process's rollout stats file now: the
    controller writes it at most once a second, and a test has no second to wait for that."""
    controller._written = float("-inf")  # noqa: SLF001 - the once-a-second limit, not under test
    controller.refresh(force=True)
