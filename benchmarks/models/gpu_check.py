"""Judge CUDA and fp16 for serving, with numbers from a real task, and print a verdict.

1. **fp16 on a real task.** An MLP classifier trained on scikit-learn's handwritten digits (the
   data ships with scikit-learn: 1,797 8x8 images, 10 classes), half the rows held out. The fp32
   model and its fp16 twin, made as ``redline optimize`` makes it (float16 inside, float32 at
   the edges), answer the held-out rows through redline's ``InferenceSession`` in batches of the
   sizes the batcher forms (1, 8, 32, 64): accuracy, macro one-vs-rest AUC and log loss of each,
   predictions that change, and each batch's latency (p50/p99, the two models in turns).
   Verdict: fp16 is worth serving when it keeps accuracy and AUC within ``--tolerance`` at every
   batch size and is at least ``--min-speedup`` faster at one of them.
2. On a GPU, rows/s of a wide synthetic MLP (``--hidden``) at large batches: CPU fp32 with one
   thread (redline's default) and with every core, CUDA fp32 and CUDA fp16.
3. ``redline optimize``'s own fp16 decision on the real task (on a GPU; on a CPU it skips fp16
   and the reason is printed), and on a GPU on part 2's MLP too.

Without a CUDA provider (no ``redline[gpu]``, or CUDA did not start) it says so first, measures
on the CPU only, and its verdict covers accuracy, not speed: CPU timings of fp16 say nothing
about a GPU.

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from redline.config import RuntimeSettings
from redline.models.metadata import ModelMetadata
from redline.models.repository import inspect_onnx
from redline.models.runtime import InferenceSession

WIDTHS = [256, 1024, 1024, 1024, 4]  # the synthetic MLP of part 2 (--hidden sets the middle)
CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
CPU = ["CPUExecutionProvider"]
SERVING_BATCHES = "1,8,32,64"  # warm-up's sizes, the default max_batch_size and the GPU page's


def mlp(weights: list[np.ndarray], biases: list[np.ndarray]) -> bytes:
    """A dense ReLU classifier with a softmax, one Gemm a layer: the shape of model GPUs serve
    (what torch.onnx.export makes of an nn.Sequential of Linear and ReLU)."""
    nodes, inits, prev = [], [], "x"
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(b.astype(np.float32), f"b{i}")]
        out = f"h{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [out]))
        if i < len(weights) - 1:
            nodes.append(helper.make_node("Relu", [out], [out + "r"]))
            out += "r"
        prev = out
    nodes.append(helper.make_node("Softmax", [prev], ["probabilities"], axis=1))
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", weights[0].shape[0]])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT,
                                       ["N", weights[-1].shape[1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model.SerializeToString()


def synthetic_mlp(seed: int = 0) -> bytes:
    """Part 2's MLP: He-initialised weights of ``WIDTHS`` (its speed, not its answers, counts)."""
    rng = np.random.default_rng(seed)
    pairs = list(zip(WIDTHS[:-1], WIDTHS[1:], strict=True))
    return mlp([rng.standard_normal((a, b)) * np.sqrt(2.0 / a) for a, b in pairs],
               [np.zeros(b) for _, b in pairs])


@dataclass
class Task:
    """A trained classifier and the rows it was not trained on."""

    name: str
    model: bytes
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int


def digits_task(hidden: int, seed: int = 0) -> Task:
    """An MLP (64 -> hidden -> hidden -> 10) trained on half of the digits, standardising folded
    into its first layer so that the model takes raw pixels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.5, stratify=y,
                                              random_state=seed)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-6  # some border pixels are always 0
    clf = MLPClassifier((hidden, hidden), max_iter=300, random_state=seed)
    clf.fit((x_tr - mean) / std, y_tr)
    weights, biases = list(clf.coefs_), list(clf.intercepts_)
    weights[0] = clf.coefs_[0] / std[:, None]
    biases[0] = clf.intercepts_[0] - (mean / std) @ clf.coefs_[0]
    return Task(f"digits MLP 64-{hidden}-{hidden}-10", mlp(weights, biases), x_tr, y_tr,
                x_te, y_te, 10)


def fp16(model: bytes) -> bytes:
    """The fp16 twin exactly as ``redline optimize``'s fp16 candidate converts it."""
    from redline.optimize.quantize import to_fp16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnxconverter-common: tiny weights rounded to 0
        return to_fp16(model)


def session(model: bytes, providers: list[str], threads: int = 1) -> InferenceSession:
    inputs, outputs = inspect_onnx(model, "mlp")
    meta = ModelMetadata(name="mlp", version=1, sha256="", inputs=inputs, outputs=outputs)
    return InferenceSession(model, meta, RuntimeSettings(providers=providers,
                                                         intra_op_threads=threads))


def cuda_works() -> tuple[bool, str]:
    """Whether a session asked onto CUDA runs there, and if not, why (redline's own words)."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, ("no CUDA execution provider in this onnxruntime build (it has "
                       f"{', '.join(ort.get_available_providers())}): install redline[gpu]")
    probe = session(synthetic_mlp(), CUDA)
    if probe.providers[0] != CUDA[0]:
        return False, probe.provider_fallback or f"CUDA was asked for, {probe.providers} ran"
    return True, "CUDA"


# --- part 1: fp16 on the real task -----------------------------------------------------------

def predict(sess: InferenceSession, x: np.ndarray, batch: int) -> np.ndarray:
    """Every row's probabilities, the rows sent ``batch`` at a time as the batcher would."""
    return np.concatenate([sess.run({"x": x[i:i + batch]})["probabilities"]
                           for i in range(0, len(x), batch)])


def scores(y: np.ndarray, proba: np.ndarray, classes: int) -> dict[str, float]:
    from sklearn.metrics import log_loss, roc_auc_score

    proba = proba.astype(np.float64)
    proba /= proba.sum(1, keepdims=True)  # fp16's rows may sum to 1 +- 1e-3
    return {"accuracy": float(np.mean(proba.argmax(1) == y)),
            "auc": float(roc_auc_score(y, proba, multi_class="ovr", labels=range(classes))),
            "log_loss": float(log_loss(y, proba, labels=range(classes)))}


def paired_latency(a: InferenceSession, b: InferenceSession, x: np.ndarray,
                   seconds: float) -> tuple[list[float], list[float]]:
    """Per-call µs of ``a`` and ``b`` on the same input, in turns (so both see the same noise)."""
    feed = {"x": x}
    a.run(feed)
    b.run(feed)
    ta: list[float] = []
    tb: list[float] = []
    start = time.perf_counter()
    while len(ta) < 20 or time.perf_counter() - start < seconds:
        for sess, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            sess.run(feed)
            out.append((time.perf_counter() - t0) * 1e6)
    return ta, tb


def judge_fp16(task: Task, providers: list[str], batches: list[int], seconds: float,
               tolerance: float, min_speedup: float, on_gpu: bool) -> dict[str, Any]:
    full, half = session(task.model, providers), session(fp16(task.model), providers)
    rows = []
    for batch in batches:
        p32, p16 = predict(full, task.x_test, batch), predict(half, task.x_test, batch)
        t32, t16 = paired_latency(full, half, task.x_test[:batch], seconds)
        rows.append({
            "batch": batch, "fp32": scores(task.y_test, p32, task.classes),
            "fp16": scores(task.y_test, p16, task.classes),
            "changed_predictions": int(np.sum(p32.argmax(1) != p16.argmax(1))),
            "max_abs_diff": float(np.max(np.abs(p32 - p16))),
            "fp32_us": {"p50": float(np.median(t32)), "p99": float(np.percentile(t32, 99))},
            "fp16_us": {"p50": float(np.median(t16)), "p99": float(np.percentile(t16, 99))},
            "speedup_p50": float(np.median(t32) / np.median(t16)),
        })
    lost = [r["batch"] for r in rows if any(
        r["fp16"][m] < r["fp32"][m] * (1 - tolerance) for m in ("accuracy", "auc"))]
    faster = [r["batch"] for r in rows if r["speedup_p50"] >= min_speedup]
    keeps = (f"keeps accuracy and AUC within {tolerance:.0%} at every batch size"
             if not lost else f"loses more than {tolerance:.0%} of accuracy or AUC at batch "
                              f"size(s) {lost}")
    if not on_gpu:
        verdict = (f"measured on the CPU only: fp16 {keeps} on {len(task.y_test)} held-out rows; "
                   "its speed is not judged (CPU timings of fp16 say nothing about a GPU: run "
                   "this on a machine with an NVIDIA GPU and redline[gpu])")
    elif lost:
        verdict = f"keep fp32: fp16 {keeps}"
    elif not faster:
        best = max(rows, key=lambda r: r["speedup_p50"])
        verdict = (f"keep fp32: fp16 {keeps}, but is not {min_speedup}x faster at any serving "
                   f"batch size (best {best['speedup_p50']:.2f}x at batch {best['batch']})")
    else:
        verdict = (f"serve fp16: it {keeps} and is at least {min_speedup}x faster (p50) at "
                   f"batch size(s) {faster}")
    return {"task": task.name, "held_out_rows": len(task.y_test), "providers": full.providers,
            "tolerance": tolerance, "min_speedup": min_speedup, "rows": rows,
            "verdict": verdict}


def print_judgement(result: dict[str, Any], on_gpu: bool) -> None:
    where = "CUDA" if on_gpu else "CPU"
    print(f"\nfp16 vs fp32 on {result['task']}, {result['held_out_rows']} held-out rows, "
          f"on {where}:")
    print(f"{'batch':>5} {'accuracy 32/16':>15} {'AUC 32/16':>17} {'changed':>7} "
          f"{'p50 µs 32/16':>15} {'p99 µs 32/16':>15} {'speed-up':>8}")
    for r in result["rows"]:
        a, b = r["fp32"], r["fp16"]
        print(f"{r['batch']:>5} {a['accuracy']:>7.4f}/{b['accuracy']:<7.4f} "
              f"{a['auc']:>8.5f}/{b['auc']:<8.5f} {r['changed_predictions']:>7} "
              f"{r['fp32_us']['p50']:>7.0f}/{r['fp16_us']['p50']:<7.0f} "
              f"{r['fp32_us']['p99']:>7.0f}/{r['fp16_us']['p99']:<7.0f} "
              f"{r['speedup_p50']:>7.2f}x")
    print(f"VERDICT: {result['verdict']}", flush=True)


# --- part 2: throughput of the synthetic MLP (GPU) -------------------------------------------

def time_cell(sess: InferenceSession, x: np.ndarray, seconds: float) -> list[float]:
    """Per-call latencies (ms) through redline's run, at least 3 calls."""
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


# --- part 3: redline optimize's decision (GPU) -----------------------------------------------

def gate(task: Task, batch: int, on_gpu: bool, why: str) -> dict[str, Any]:
    """redline optimize's own decision on fp16 for the real task's model; without CUDA, why it
    makes none (its own reason where the build has no GPU provider)."""
    from redline.optimize import OptimizeOptions, optimize
    from redline.optimize.quantize import fp16_candidates

    if not on_gpu:
        for cand in fp16_candidates(task.model, None):  # type: ignore[arg-type]  # ctx unused
            return {"chosen": None, "reason": getattr(cand, "reason", f"not run: {why}")}
    x = np.concatenate([task.x_train, task.x_test])
    y = np.concatenate([task.y_train, task.y_test])
    report = optimize(task.model, x, y, task="classification",
                      class_labels=list(range(task.classes)),
                      options=OptimizeOptions(techniques=["fp16"], batch_size=batch, rounds=200,
                                              max_seconds=20.0),
                      base_settings=RuntimeSettings(providers=CUDA), name="digits")
    out = report.to_dict()
    return {k: out[k] for k in ("chosen", "reason", "skipped", "rejected", "candidates")}


def synthetic_gate(model: bytes, batch: int) -> dict[str, Any]:
    """optimize's decision on part 2's MLP, labelled by itself with 5% of labels flipped (the
    1,024- and 4,096-wide decisions in docs/performance.md)."""
    from redline.optimize import OptimizeOptions, optimize

    rng = np.random.default_rng(3)
    x = rng.standard_normal((30000, WIDTHS[0])).astype(np.float32)
    y = session(model, CUDA).run({"x": x})["probabilities"].argmax(1)
    flip = rng.random(len(y)) < 0.05  # labels the model gets wrong, so accuracy is not 1
    y[flip] = rng.integers(0, WIDTHS[-1], flip.sum())
    report = optimize(model, x, y, task="classification", class_labels=list(range(WIDTHS[-1])),
                      options=OptimizeOptions(techniques=["fp16"], batch_size=batch, rounds=200,
                                              max_seconds=20.0),
                      base_settings=RuntimeSettings(providers=CUDA), name="mlp")
    out = report.to_dict()
    return {k: out[k] for k in ("chosen", "reason", "skipped", "rejected", "candidates")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu.json")
    ap.add_argument("--serving-batches", default=SERVING_BATCHES,
                    help="batch sizes of the fp16 judgement (the batcher's)")
    ap.add_argument("--task-hidden", type=int, default=256,
                    help="width of the real task's two hidden layers")
    ap.add_argument("--tolerance", type=float, default=0.01,
                    help="largest relative loss of accuracy or AUC (redline optimize's default)")
    ap.add_argument("--min-speedup", type=float, default=1.05,
                    help="p50 speed-up that makes fp16 worth it (redline optimize's default)")
    ap.add_argument("--latency-seconds", type=float, default=0.5,
                    help="timed seconds per batch size, both models in turns")
    ap.add_argument("--batches", default="1,32,256,2048,16384", help="part 2's batch sizes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.4, help="part 2's timed seconds per cell")
    ap.add_argument("--hidden", type=int, default=1024, help="part 2's hidden layer width")
    ap.add_argument("--gate-batch", type=int, default=32, help="optimize's batch (the server's)")
    ap.add_argument("--variants", default="", help="comma list to time in part 2 (default all)")
    ap.add_argument("--synthetic-gate-batch", type=int, default=256,
                    help="optimize's batch on part 2's MLP (0: skip that decision)")
    args = ap.parse_args()
    WIDTHS[1:4] = [args.hidden] * 3
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* wheels, when installed that way
    on_gpu, why = cuda_works()
    result: dict[str, Any] = {"onnxruntime": ort.__version__,
                              "available": ort.get_available_providers(), "cuda": on_gpu,
                              "cpu_count": os.cpu_count(), "python": platform.python_version()}
    if not on_gpu:
        print(f"CPU ONLY: {why}.\nMeasuring on the CPU: the verdict covers fp16's accuracy, "
              "not its speed on a GPU; parts 2 and 3 need CUDA.", flush=True)
    else:
        try:
            import torch

            result["gpu"] = torch.cuda.get_device_name(0)
        except Exception as exc:  # torch is only for the device's name
            result["gpu"] = f"unknown ({exc})"
    print(json.dumps(result), flush=True)

    print(f"training the real task's classifier (hidden {args.task_hidden})...", flush=True)
    task = digits_task(args.task_hidden)
    batches = [int(b) for b in args.serving_batches.split(",")]
    result["fp16_judgement"] = judge_fp16(task, CUDA if on_gpu else CPU, batches,
                                          args.latency_seconds, args.tolerance,
                                          args.min_speedup, on_gpu)
    print_judgement(result["fp16_judgement"], on_gpu)
    result["optimize_fp16"] = gate(task, args.gate_batch, on_gpu, why)
    print("redline optimize on fp16:",
          json.dumps({k: result["optimize_fp16"].get(k) for k in ("chosen", "reason")}),
          flush=True)

    if on_gpu:
        model = synthetic_mlp()
        variants = {
            "cpu-fp32-1thread": session(model, CPU, 1),
            f"cpu-fp32-{os.cpu_count()}threads": session(model, CPU, 0),
            "cuda-fp32": session(model, CUDA, 1),
            "cuda-fp16": session(fp16(model), CUDA, 1),
        }
        result["widths"] = WIDTHS
        result["providers"] = {k: v.providers for k, v in variants.items()}
        if args.variants:
            variants = {k: v for k, v in variants.items() if k in args.variants.split(",")}
        result["throughput"] = throughput(variants, [int(b) for b in args.batches.split(",")],
                                          args.rounds, args.seconds)
        for row in result["throughput"]:
            print(f"{row['variant']:>20} batch {row['batch']:>6}: "
                  f"{row['rows_per_s']['median']:>12,.0f} rows/s  "
                  f"p50 {row['p50_ms_median']:.3f} ms", flush=True)
        if args.synthetic_gate_batch:
            result["optimize_fp16_synthetic"] = synthetic_gate(model, args.synthetic_gate_batch)
            print(f"redline optimize on fp16, {args.hidden}-wide MLP:", json.dumps(
                {k: result["optimize_fp16_synthetic"][k] for k in ("chosen", "reason")}),
                flush=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
