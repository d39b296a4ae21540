"""int8 quantization with ONNX Runtime's tools, and fp16 where a GPU can use it.

Dynamic quantization stores int8 weights and quantizes activations per call; static
quantization (QDQ) calibrates activation ranges with a chosen method. The options users of ONNX
Runtime's quantizer, Intel Neural Compressor and Optimum expect are here: ``quant_pre_process``
(shape inference and graph cleanup first), per-channel weights, reduce-range (7-bit weights for
CPUs without VNNI), and the number of calibration rows.

Rows are kept apart: calibration uses the fit rows; when a statically quantized model loses too
much, nodes are left in float one at a time, judged on the *choice* rows (never the rows that
calibrated it, never the evaluation rows that report the final figure).

Entropy calibration (KL divergence, as TensorRT does) only differs from min-max when the
histogram has more bins than the quantized range has levels, so that some clipping can win:
ONNX Runtime's default is 128 and 128, which never clips, so entropy runs with 2048 bins here.
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

from redline.optimize.candidates import Candidate, QuantizationOptions, Skipped, TuneContext

QUANTIZABLE_OPS = ("MatMul", "Gemm")
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
_MAX_EXCLUSION_TRIES = 12
CALIBRATION_ROWS = 512
ENTROPY_BINS = 2048  # histogram bins; 128 quantized levels (uint8 activations)
ENTROPY_QUANTIZED_BINS = 128


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


def preprocess(data: bytes) -> bytes:
    """ONNX Runtime's ``quant_pre_process``: shape inference and graph optimization, the step
    its documentation asks for before quantizing."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp, _quiet():
        source, out = Path(tmp) / "model.onnx", Path(tmp) / "pre.onnx"
        source.write_bytes(data)
        quant_pre_process(str(source), str(out), skip_symbolic_shape=True)
        return out.read_bytes()


def dynamic_int8(data: bytes, *, per_channel: bool = False, reduce_range: bool = False,
                 exclude: list[str] | None = None) -> bytes:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.onnx"
        with _quiet():
            quantize_dynamic(_named(data), out, op_types_to_quantize=list(QUANTIZABLE_OPS),
                             per_channel=per_channel, reduce_range=reduce_range,
                             weight_type=QuantType.QInt8, nodes_to_exclude=exclude or [])
        return out.read_bytes()


def _entropy_ranges(model: onnx.ModelProto, reader: _Calibration, folder: Path) -> Path:
    """Entropy calibration with more histogram bins than quantized levels, saved as the
    calibration cache that ``quantize_static`` reads instead of calibrating again."""
    from onnxruntime.quantization import CalibrationMethod, create_calibrator, save_tensors_data

    source = folder / "model.onnx"
    onnx.save_model(model, source)
    calibrator = create_calibrator(
        source, list(QUANTIZABLE_OPS), augmented_model_path=str(folder / "augmented.onnx"),
        calibrate_method=CalibrationMethod.Entropy,
        extra_options={"num_bins": ENTROPY_BINS, "num_quantized_bins": ENTROPY_QUANTIZED_BINS})
    calibrator.collect_data(reader)
    cache = folder / "ranges.json"
    save_tensors_data(calibrator.compute_data(), cache)
    return cache


def static_int8(data: bytes, x: np.ndarray, *, method: str = "minmax", per_channel: bool = True,
                reduce_range: bool = False, exclude: list[str] | None = None,
                calibration_rows: int = CALIBRATION_ROWS) -> bytes:
    """QDQ int8: uint8 activations and int8 weights (U8S8, the fast path on x86 CPUs),
    calibrated on the first ``calibration_rows`` of ``x``."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    model = _named(data)
    input_name = model.graph.input[0].name
    extra: dict[str, Any] = {"CalibPercentile": 99.99} if method == "percentile" else {}
    reader = _Calibration(input_name, x[:calibration_rows])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.onnx"
        with _quiet():
            cache = _entropy_ranges(model, reader, Path(tmp)) if method == "entropy" else None
            quantize_static(
                model, out, None if cache else reader, calibration_cache_path=cache,
                quant_format=QuantFormat.QDQ, op_types_to_quantize=list(QUANTIZABLE_OPS),
                per_channel=per_channel, reduce_range=reduce_range,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibrate_method=methods[method], nodes_to_exclude=exclude or [],
                extra_options=extra,
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
    q = ctx.quantization
    source = model
    if q.preprocess:
        try:
            source = preprocess(model)
        except Exception as exc:  # pre-processing is advice, not a requirement
            yield Skipped("quant_pre_process", "quantize",
                          f"ONNX Runtime's quant_pre_process failed ({str(exc)[:150]}); "
                          "quantizing the model as registered")
            source = model
        nodes = quantizable_nodes(onnx.load_from_string(source)) or nodes
    common = {"preprocessed": q.preprocess and source is not model,
              "reduce_range": q.reduce_range, "weights": "int8"}
    yield _dynamic(model, source, q, common)
    chosen = methods or q.methods or (("minmax",) if ctx.fast else CALIBRATION_METHODS)
    raw_nodes = quantizable_nodes(onnx.load_from_string(model))
    for method in chosen:
        name = f"int8-static-{method}"
        try:
            yield _static_within_tolerance(source, ctx, nodes, method, name, common)
            continue
        except Exception as exc:
            if source is model:
                yield Skipped(name, "quantize", f"static quantization failed: {str(exc)[:200]}")
                continue
            first = str(exc)[:120]
        try:  # ONNX Runtime's QDQ quantizer fails on some pre-processed graphs (fused Gemm)
            yield _static_within_tolerance(
                model, ctx, raw_nodes, method, name,
                {**common, "preprocessed": False,
                 "preprocess_note": f"quantized as registered: on the pre-processed graph "
                                    f"the quantizer failed ({first})"})
        except Exception as exc:
            yield Skipped(name, "quantize", f"static quantization failed: {str(exc)[:200]}")


def _dynamic(model: bytes, source: bytes, q: QuantizationOptions,
             common: dict[str, Any]) -> Candidate | Skipped:
    """Dynamic int8 of the pre-processed graph, else of the graph as registered: ONNX Runtime's
    dynamic quantizer cannot type the tensors that pre-processing fuses out of some graphs
    (a scikit-learn StandardScaler folded into Mul/Add before an MLP), as its static one can't."""
    per_channel = bool(q.per_channel) if q.per_channel is not None else False

    def make(data: bytes, extra: dict[str, Any]) -> Candidate:
        return Candidate("int8-dynamic", "quantize",
                         dynamic_int8(data, per_channel=per_channel, reduce_range=q.reduce_range),
                         recipe={"method": "dynamic", "per_channel": per_channel, **extra},
                         note="int8 weights, activations quantized per call")

    try:
        return make(source, common)
    except Exception as exc:  # the quantizer raises many types on unusual graphs
        if source is model:
            return Skipped("int8-dynamic", "quantize", f"ONNX Runtime's quantizer failed: {exc}")
        first = str(exc)[:120]
    try:
        return make(model, {**common, "preprocessed": False,
                            "preprocess_note": f"quantized as registered: on the pre-processed "
                                               f"graph the quantizer failed ({first})"})
    except Exception as exc:
        return Skipped("int8-dynamic", "quantize", f"ONNX Runtime's quantizer failed: {exc}")


def _static_within_tolerance(model: bytes, ctx: TuneContext, nodes: list[str], method: str,
                             name: str, common: dict[str, Any]) -> Candidate | Skipped:
    """Static QDQ calibrated on the fit rows; if it loses too much on the choice rows, exclude
    the worst nodes greedily (each trial judged on the choice rows, never the calibration rows)."""
    q = ctx.quantization
    per_channel = q.per_channel if q.per_channel is not None else True
    rows = min(len(ctx.x), q.calibration_rows)

    def make(exclude: list[str]) -> bytes:
        return static_int8(model, ctx.x, method=method, per_channel=per_channel,
                           reduce_range=q.reduce_range, exclude=exclude, calibration_rows=rows)

    excluded: list[str] = []
    best = make([])
    loss = ctx.loss_of(best)
    tries = 0
    while loss > ctx.tolerance and len(excluded) < len(nodes) - 1 and tries < _MAX_EXCLUSION_TRIES:
        trial_best: tuple[float, str, bytes] | None = None
        for node in nodes:
            if node in excluded or tries >= _MAX_EXCLUSION_TRIES:
                continue
            tries += 1
            q_bytes = make([*excluded, node])
            trial = ctx.loss_of(q_bytes)
            if trial_best is None or trial < trial_best[0]:
                trial_best = (trial, node, q_bytes)
        if trial_best is None or trial_best[0] >= loss:
            break
        loss, node, best = trial_best
        excluded.append(node)
    if loss > ctx.tolerance:
        return Skipped(name, "quantize",
                       f"loses {loss:.2%} {ctx.metric} on the choice rows even with "
                       f"{len(excluded)} node(s) kept in float; tolerance is {ctx.tolerance:.2%}")
    suffix = f" ({len(excluded)} node(s) kept in float: {', '.join(excluded)})" if excluded else ""
    recipe = {"method": "static-qdq", "calibration": method, "per_channel": per_channel,
              "activations": "uint8", "excluded_nodes": excluded, "calibration_rows": rows,
              "exclusion_judged_on": "choice rows", **common}
    if method == "entropy":
        recipe["histogram_bins"] = [ENTROPY_BINS, ENTROPY_QUANTIZED_BINS]
    return Candidate(
        name + (f"-excl{len(excluded)}" if excluded else ""), "quantize", best, recipe=recipe,
        note=f"QDQ int8, {method} calibration on {rows} rows{suffix}",
    )


def to_fp16(model: bytes) -> bytes:
    """float16 weights and math, float32 inputs and outputs (``benchmarks/models/gpu_check.py``
    judges the same conversion). Needs onnxconverter-common."""
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(onnx.load_from_string(model),
                                            keep_io_types=True).SerializeToString()


def fp16_candidates(model: bytes, ctx: TuneContext) -> Iterator[Candidate | Skipped]:
    """fp16 pays off only on GPUs; on a CPU-only build it is skipped with the reason."""
    available = ort.get_available_providers()
    gpu = [p for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider") if p in available]
    if not gpu:
        yield Skipped("fp16", "fp16", "no GPU execution provider in this ONNX Runtime build "
                      f"(available: {', '.join(available)}); fp16 is only faster on a GPU — run "
                      "optimize on a CUDA machine with redline[gpu] installed")
        return
    try:
        half = to_fp16(model)
    except ImportError:
        yield Skipped("fp16", "fp16", "needs onnxconverter-common: pip install 'redline[convert]'")
        return
    except Exception as exc:
        yield Skipped("fp16", "fp16", f"fp16 conversion failed: {str(exc)[:200]}")
        return
    yield Candidate("fp16", "fp16", half,
                    settings={"providers": [gpu[0], "CPUExecutionProvider"]},
                    recipe={"precision": "fp16", "provider": gpu[0], "keep_io_types": True},
                    note=f"float16 weights and math on {gpu[0]}")
