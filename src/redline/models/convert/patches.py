"""Fixes applied to third-party converters before they run, each once per process.

Each patch wraps one function of skl2onnx or onnxmltools and marks the wrapper, so applying it
again is a no-op. They change what the converters emit, never what redline accepts: the parity
check still judges the result.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def patch_skl2onnx_missing_flags() -> None:
    """Work around skl2onnx 1.20 passing numpy booleans for HistGradientBoosting's
    ``nodes_missing_value_tracks_true`` (onnx >= 1.17 rejects them): cast them to int."""
    from skl2onnx.common import tree_ensemble

    original = tree_ensemble.add_node
    if getattr(original, "_redline_int_flags", False):
        return

    def add_node(*args: Any, nodes_missing_value_tracks_true: Any = 0, **kwargs: Any) -> Any:
        flag = int(nodes_missing_value_tracks_true)
        return original(*args, nodes_missing_value_tracks_true=flag, **kwargs)

    add_node._redline_int_flags = True  # type: ignore[attr-defined]
    tree_ensemble.add_node = add_node


def patch_lightgbm_thresholds() -> None:
    """Make LightGBM splits exact in float32.

    LightGBM tests ``x <= t`` with a double ``t``; ONNX stores ``t`` as the *nearest* float32,
    which can round up past an input value and send that row the wrong way. For a float32 ``x``,
    ``x <= t`` holds exactly when ``x <= floor32(t)`` (the largest float32 not above ``t``), so
    the dumped thresholds are rounded down before onnxmltools builds the graph.
    """
    from onnxmltools.convert.lightgbm.operator_converters import LightGbm

    original = LightGbm.dump_booster_model
    if getattr(original, "_redline_floor32", False):
        return

    def dump_booster_model(*args: Any, **kwargs: Any) -> Any:
        dump, info = original(*args, **kwargs)
        for tree in dump.get("tree_info", []):
            floor32_thresholds(tree.get("tree_structure", {}))
        return dump, info

    dump_booster_model._redline_floor32 = True  # type: ignore[attr-defined]
    LightGbm.dump_booster_model = dump_booster_model


def floor32_thresholds(node: dict[str, Any]) -> None:
    """Round every ``<=`` threshold of a dumped LightGBM tree down to a float32, in place."""
    stack = [node]
    while stack:
        current = stack.pop()
        if current.get("decision_type") == "<=" and isinstance(
            current.get("threshold"), (int, float)
        ):
            t = float(current["threshold"])
            with np.errstate(over="ignore"):  # thresholds beyond float32 floor to its max below
                f = np.float32(t)
            if float(f) > t:
                f = np.nextafter(f, np.float32(-np.inf))
            current["threshold"] = float(f)
        stack.extend(c for c in (current.get("left_child"), current.get("right_child")) if c)
