"""int8 quantization with ONNX Runtime's tools, and fp16 where a GPU can use it.

Dynamic quantization stores int8 weights and quantizes activations per call; static
quantization (QDQ) calibrates activation ranges on the tuning split with a chosen method. When a
statically quantized model loses more accuracy than allowed, the nodes that hurt most are left
in float, one at a time, until it fits (or the search gives up) — the accuracy cliffs users meet
with default settings usually come from one layer, typically the last.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from redline.optimize.candidates import Candidate, Skipped, TuneContext

QUANTIZABLE_OPS = ("MatMul", "Gemm")
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
_MAX_EXCLUSION_TRIES = 12
_CALIBRATION_ROWS = 512


def quantizable_nodes(model: onnx.ModelProto) -> list[str]:
    """MatMul/Gemm nodes whose weights are constants (the only place int8 pays off here)."""
    inits = {i.name for i in model.graph.initializer}
    names = []
    for i, node in enumerate(model.graph.node):
        if node.op_type in QUANTIZABLE_OPS and len(node.input) > 1 and node.input[1] in inits:
            if not node.name:
                node.name = f"{node.op_type}_{i}"
            names.append(node.name)
    return names


class _Calibration:
    """ONNX Runtime's CalibrationDataReader protocol over rows of the tuning split."""

    def __init__(self, input_name: str, x: np.ndarray, batch: int = 32) -> None:
        # Equal-sized batches only: the histogram calibrators stack them and choke on a ragged end.
        usable = max(batch, len(x) - len(x) % batch) if len(x) >= batch else len(x)
        self._batches = [{input_name: np.ascontiguousarray(x[i:i + batch], dtype=np.float32)}
                         for i in range(0, usable, batch)]
        self._it = iter(self._batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._batches)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The quantizer logs advice to the root logger and prints progress; keep reports clean."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _named(data: bytes) -> onnx.ModelProto:
    model = onnx.load_from_string(data)
    quantizable_nodes(model)  # give unnamed nodes names so they can be excluded
    return model


def dynamic_int8(data: bytes, *, per_channel: bool = False,
                 exclude: list[str] | None = None) -> bytes:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.onnx"
        with _quiet():
            quantize_dynamic(_named(data), out, op_types_to_quantize=list(QUANTIZABLE_OPS),
                             per_channel=per_channel, weight_type=QuantType.QInt8,
                             nodes_to_exclude=exclude or [])
        return out.read_bytes()


def static_int8(data: bytes, x: np.ndarray, *, method: str = "minmax", per_channel: bool = True,
                exclude: list[str] | None = None) -> bytes:
    """QDQ int8: uint8 activations and int8 weights (U8S8, the fast path on x86 CPUs)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    model = _named(data)
    input_name = model.graph.input[0].name
    extra: dict[str, Any] = {"CalibPercentile": 99.99} if method == "percentile" else {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.onnx"
        with _quiet():
            quantize_static(
                model, out, _Calibration(input_name, x[:_CALIBRATION_ROWS]),
                quant_format=QuantFormat.QDQ, op_types_to_quantize=list(QUANTIZABLE_OPS),
                per_channel=per_channel, activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8, calibrate_method=methods[method],
                nodes_to_exclude=exclude or [], extra_options=extra,
            )
        return out.read_bytes()


def quantize_candidates(model: bytes, ctx: TuneContext,
                        methods: tuple[str, ...] | None = None) -> Iterator[Candidate | Skipped]:
    nodes = quantizable_nodes(onnx.load_from_string(model))
    if not nodes:
        yield Skipped("int8", "quantize", "no MatMul/Gemm with constant weights to quantize "
                      "(tree ensembles run on ai.onnx.ml operators, which have no int8 form); "
                      "try fewer trees or distillation instead")
        return
    try:
        q = dynamic_int8(model)
        yield Candidate("int8-dynamic", "quantize", q,
                        recipe={"method": "dynamic", "weights": "int8", "per_channel": False},
                        note="int8 weights, activations quantized per call")
    except Exception as exc:  # the quantizer raises many types on unusual graphs
        yield Skipped("int8-dynamic", "quantize", f"ONNX Runtime's quantizer failed: {exc}")
    chosen = methods or (("minmax",) if ctx.fast else CALIBRATION_METHODS)
    for method in chosen:
        name = f"int8-static-{method}"
        try:
            yield _static_within_tolerance(model, ctx, nodes, method, name)
        except Exception as exc:
            yield Skipped(name, "quantize", f"static quantization failed: {str(exc)[:200]}")


def _static_within_tolerance(model: bytes, ctx: TuneContext, nodes: list[str], method: str,
                             name: str) -> Candidate | Skipped:
    """Static QDQ; if it loses too much on the tuning split, exclude the worst nodes greedily."""
    excluded: list[str] = []
    best = static_int8(model, ctx.x, method=method)
    loss = ctx.loss_of(best)
    tries = 0
    while loss > ctx.tolerance and len(excluded) < len(nodes) - 1 and tries < _MAX_EXCLUSION_TRIES:
        trial_best: tuple[float, str, bytes] | None = None
        for node in nodes:
            if node in excluded or tries >= _MAX_EXCLUSION_TRIES:
                continue
            tries += 1
            q = static_int8(model, ctx.x, method=method, exclude=[*excluded, node])
            trial = ctx.loss_of(q)
            if trial_best is None or trial < trial_best[0]:
                trial_best = (trial, node, q)
        if trial_best is None or trial_best[0] >= loss:
            break
        loss, node, best = trial_best
        excluded.append(node)
    if loss > ctx.tolerance:
        return Skipped(name, "quantize",
                       f"loses {loss:.2%} {ctx.metric} on the tuning split even with "
                       f"{len(excluded)} node(s) kept in float; tolerance is {ctx.tolerance:.2%}")
    suffix = f" ({len(excluded)} node(s) kept in float: {', '.join(excluded)})" if excluded else ""
    return Candidate(
        name + (f"-excl{len(excluded)}" if excluded else ""), "quantize", best,
        recipe={"method": "static-qdq", "calibration": method, "per_channel": True,
                "activations": "uint8", "weights": "int8", "excluded_nodes": excluded,
                "calibration_rows": int(min(len(ctx.x), _CALIBRATION_ROWS))},
        note=f"QDQ int8, {method} calibration{suffix}",
    )


def fp16_candidates(model: bytes, ctx: TuneContext) -> Iterator[Candidate | Skipped]:
    """fp16 pays off only on GPUs; on a CPU-only build it is skipped with the reason."""
    available = ort.get_available_providers()
    gpu = [p for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider") if p in available]
    if not gpu:
        yield Skipped("fp16", "fp16", "no GPU execution provider in this ONNX Runtime build "
                      f"(available: {', '.join(available)}); fp16 is only faster on a GPU — run "
                      "optimize on a CUDA machine with onnxruntime-gpu installed")
        return
    try:
        from onnxconverter_common import float16
    except ImportError:
        yield Skipped("fp16", "fp16", "needs onnxconverter-common: pip install 'redline[convert]'")
        return
    try:
        half = float16.convert_float_to_float16(onnx.load_from_string(model), keep_io_types=True)
    except Exception as exc:
        yield Skipped("fp16", "fp16", f"fp16 conversion failed: {str(exc)[:200]}")
        return
    yield Candidate("fp16", "fp16", half.SerializeToString(),
                    settings={"providers": [gpu[0], "CPUExecutionProvider"]},
                    recipe={"precision": "fp16", "provider": gpu[0], "keep_io_types": True},
                    note=f"float16 weights and math on {gpu[0]}")
