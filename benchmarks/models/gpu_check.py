"""Check redline's CUDA execution provider and fp16 path on a GPU machine, with numbers.

Needs ``onnxruntime-gpu`` (and ``onnxconverter-common`` for fp16). Three parts:

1. redline's ``InferenceSession`` asked for ``CUDAExecutionProvider`` really runs on it;
2. one MLP (256 -> 3 x ``--hidden`` -> 4, softmax) timed interleaved over rounds at several
   batch sizes: CPU fp32 with one thread (redline's default) and with every core, CUDA fp32, and
   CUDA fp16 as ``redline optimize`` makes it (float16 inside, float32 at the edges);
3. ``redline.optimize.optimize(techniques=["fp16"])`` on that model: the accuracy gate and the
   paired speed-up interval that decide whether fp16 is registered.

    python benchmarks/models/gpu_check.py --out gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from redline.config import RuntimeSettings
from redline.models.metadata import ModelMetadata
from redline.models.repository import inspect_onnx
from redline.models.runtime import InferenceSession

WIDTHS = [256, 1024, 1024, 1024, 4]
CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def mlp(seed: int = 0) -> bytes:
    """A dense classifier with He-initialised weights: the shape of model GPUs serve."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:], strict=True)):
        w = (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(np.zeros(b, np.float32), f"b{i}")]
        out = f"h{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [out]))
        if i < len(WIDTHS) - 2:
            nodes.append(helper.make_node("Relu", [out], [out + "r"]))
            out += "r"
        prev = out
    nodes.append(helper.make_node("Softmax", [prev], ["probabilities"], axis=1))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTHS[0]])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", WIDTHS[-1]])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model.SerializeToString()


def fp16(model: bytes) -> tuple[bytes, str]:
    """The fp16 candidate exactly as ``redline optimize`` builds it."""
    from redline.optimize.candidates import Candidate
    from redline.optimize.quantize import fp16_candidates

    warnings.filterwarnings("ignore", module="onnxconverter_common")  # tiny weights rounded
    for cand in fp16_candidates(model, None):  # type: ignore[arg-type]  # ctx is unused
        if isinstance(cand, Candidate):
            return cand.onnx_bytes, cand.note
        raise SystemExit(f"fp16 candidate skipped: {cand.reason}")
    raise SystemExit("no fp16 candidate")


def session(model: bytes, providers: list[str], threads: int) -> InferenceSession:
    inputs, outputs = inspect_onnx(model, "mlp")
    meta = ModelMetadata(name="mlp", version=1, sha256="", inputs=inputs, outputs=outputs)
    return InferenceSession(model, meta, RuntimeSettings(providers=providers,
                                                         intra_op_threads=threads))


def time_cell(sess: InferenceSession, x: np.ndarray, seconds: float) -> list[float]:
    """Per-call latencies (ms) through redline's run (validation included), at least 3 calls."""
    feed = {"x": x}
    sess.run(feed)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        sess.run(feed)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def throughput(variants: dict[str, InferenceSession], batches: list[int], rounds: int,
               seconds: float) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    rows: dict[tuple[str, int], list[list[float]]] = {}
    for r in range(rounds):
        for batch in batches:
            x = rng.standard_normal((batch, WIDTHS[0])).astype(np.float32)
            for name, sess in variants.items():
                rows.setdefault((name, batch), []).append(time_cell(sess, x, seconds))
        print(f"round {r + 1}/{rounds} done", flush=True)
    table = []
    for (name, batch), per_round in rows.items():
        rates = sorted(batch * 1e3 / statistics.median(t) for t in per_round)
        p50s = sorted(statistics.median(t) for t in per_round)
        p99s = sorted(float(np.percentile(t, 99)) for t in per_round)
        table.append({"variant": name, "batch": batch,
                      "rows_per_s": {"min": rates[0], "median": rates[len(rates) // 2],
                                     "max": rates[-1]},
                      "p50_ms_median": p50s[len(p50s) // 2],
                      "p99_ms_median": p99s[len(p99s) // 2], "rounds": rounds})
    return table


def agreement(ref: InferenceSession, half: InferenceSession) -> dict[str, float]:
    x = np.random.default_rng(2).standard_normal((16384, WIDTHS[0])).astype(np.float32)
    a = ref.run({"x": x})["probabilities"]
    b = half.run({"x": x})["probabilities"]
    return {"rows": len(x), "max_abs_diff": float(np.max(np.abs(a - b))),
            "argmax_agreement": float(np.mean(a.argmax(1) == b.argmax(1)))}


def gate(model: bytes, batch: int) -> dict[str, Any]:
    """redline optimize's own decision on fp16 for this model, on the GPU."""
    from redline.optimize import OptimizeOptions, optimize

    rng = np.random.default_rng(3)
    x = rng.standard_normal((30000, WIDTHS[0])).astype(np.float32)
    teacher = session(model, CUDA, 1).run({"x": x})["probabilities"]
    y = teacher.argmax(1)
    flip = rng.random(len(y)) < 0.05  # labels the teacher gets wrong, so accuracy is not 1
    y[flip] = rng.integers(0, WIDTHS[-1], flip.sum())
    report = optimize(model, x, y, task="classification", class_labels=list(range(WIDTHS[-1])),
                      options=OptimizeOptions(techniques=["fp16"], batch_size=batch, rounds=200,
                                              max_seconds=20.0),
                      base_settings=RuntimeSettings(providers=CUDA), name="mlp")
    out = report.to_dict()
    return {"chosen": out["chosen"], "reason": out["reason"], "skipped": out["skipped"],
            "rejected": out["rejected"], "candidates": out["candidates"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu.json")
    ap.add_argument("--batches", default="1,32,256,2048,16384")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.4, help="timed seconds per cell")
    ap.add_argument("--hidden", type=int, default=1024, help="width of the three hidden layers")
    ap.add_argument("--gate-batch", type=int, default=256, help="optimize's typical batch")
    ap.add_argument("--variants", default="", help="comma list to time (default: all four)")
    args = ap.parse_args()
    WIDTHS[1:4] = [args.hidden] * 3
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* wheels, when installed that way
    result: dict[str, Any] = {"onnxruntime": ort.__version__,
                              "available": ort.get_available_providers(),
                              "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        result["gpu"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # torch is only for the device's name
        result["gpu"] = f"unknown ({exc})"
    print(json.dumps(result), flush=True)
    model = mlp()
    half, note = fp16(model)
    variants = {
        "cpu-fp32-1thread": session(model, ["CPUExecutionProvider"], 1),
        f"cpu-fp32-{os.cpu_count()}threads": session(model, ["CPUExecutionProvider"], 0),
        "cuda-fp32": session(model, CUDA, 1),
        "cuda-fp16": session(half, CUDA, 1),
    }
    result["widths"] = WIDTHS
    result["providers"] = {k: v.providers for k, v in variants.items()}
    if variants["cuda-fp32"].providers[0] != CUDA[0]:
        raise SystemExit(f"CUDA was asked for but not used: {result['providers']}")
    result["fp16_note"] = note
    result["fp16_vs_fp32"] = agreement(variants["cuda-fp32"], variants["cuda-fp16"])
    print(json.dumps(result["fp16_vs_fp32"]), flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    if args.variants:
        variants = {k: v for k, v in variants.items() if k in args.variants.split(",")}
    result["throughput"] = throughput(variants, batches, args.rounds, args.seconds)
    for row in result["throughput"]:
        print(f"{row['variant']:>20} batch {row['batch']:>6}: "
              f"{row['rows_per_s']['median']:>12,.0f} rows/s  p50 {row['p50_ms_median']:.3f} ms",
              flush=True)
    result["optimize_fp16"] = gate(model, args.gate_batch)
    print(json.dumps({k: result["optimize_fp16"][k] for k in ("chosen", "reason")}), flush=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
