"""Benchmark: `redline optimize` as a new user meets it, on models nobody tuned it for, checked
against rows it never saw and against solo ONNX Runtime timings of the files it chose.

Three models: a 300-tree random forest on 7 classes, a 512-256-128 MLP regressor and an
800-tree LightGBM classifier (synthetic data, fixed seeds). For each: train, register, run the
real CLI with default settings (``--train-data`` = the training rows, ``--data`` = validation
rows), then

- held-out check: the original and the registered candidate on held-out rows the tool never saw
  (accuracy and log loss, or RMSE);
- solo check: the original's and the candidate's files timed in fresh processes, one model per
  process, alternating A/B/A/B (plain ONNX Runtime, 1 thread, the same rows); the report's
  speed-up must match the solo speed-up within 15%.

    taskset -c 0 .venv/bin/python benchmarks/optimize/new_user.py [--out DIR] [--quick]

Writes ``new_user.json`` (every figure) next to the optimize reports under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from redline.cli import main
from redline.models import ModelRepository

SOLO = r"""
import sys, time, numpy as np, onnxruntime as ort
path, rows, batch, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
o = ort.SessionOptions(); o.intra_op_num_threads = 1; o.inter_op_num_threads = 1
s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
x = np.load(rows)["X"].astype(np.float32)
name = s.get_inputs()[0].name
feeds = [{name: np.ascontiguousarray(np.take(x, np.arange(i, i + batch) % len(x), axis=0))}
         for i in range(0, 16 * batch, batch)]
for i in range(50): s.run(None, feeds[i % 16])
t = []
for i in range(calls):
    t0 = time.perf_counter_ns(); s.run(None, feeds[i % 16]); t.append(time.perf_counter_ns() - t0)
print(np.percentile(t, 50) / 1000)
"""


def _cli(args: list[str]) -> None:
    print("$ redline " + " ".join(args), flush=True)
    try:
        main(args)
    except SystemExit as exc:
        if exc.code:
            raise


def _models(quick: bool) -> dict[str, dict[str, Any]]:
    """(estimator, task, data splits) per model; nothing here was tuned for the optimizer."""
    import lightgbm
    from sklearn.datasets import make_classification, make_friedman1
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.neural_network import MLPRegressor

    n = 6000 if quick else 15000
    out: dict[str, dict[str, Any]] = {}
    x, y = make_classification(n, 20, n_informative=12, n_classes=7, n_clusters_per_class=1,
                               random_state=0)
    out["forest"] = {"data": _split(x, y), "task": "classification",
                     "make": lambda: RandomForestClassifier(100 if quick else 300,
                                                            random_state=0, n_jobs=2)}
    x, y = make_friedman1(n, n_features=10, noise=1.0, random_state=0)
    out["mlp_regressor"] = {"data": _split(x, y), "task": "regression",
                            "make": lambda: MLPRegressor(
                                hidden_layer_sizes=(512, 256, 128), max_iter=40 if quick else 80,
                                random_state=0)}
    x, y = make_classification(n, 30, n_informative=15, random_state=1, flip_y=0.05)
    out["lightgbm"] = {"data": _split(x, y), "task": "classification",
                       "make": lambda: lightgbm.LGBMClassifier(
                           n_estimators=200 if quick else 800, learning_rate=0.05,
                           verbose=-1)}
    return out


def _split(x: np.ndarray, y: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    x = x.astype(np.float32)
    n = len(x)
    a, b = int(n * 0.4), int(n * 0.6)  # train 40%, optimize's --data 20%, held out 40%
    return {"train": (x[:a], y[:a]), "val": (x[a:b], y[a:b]), "held_out": (x[b:], y[b:])}


def _held_out(model: bytes, task: str, labels: list[Any] | None, x: np.ndarray,
              y: np.ndarray) -> dict[str, float]:
    from redline.optimize import ModelRunner, task_metrics

    runner = ModelRunner(model, task=task, class_labels=labels)
    return task_metrics(task, runner.predict(x), y, labels)


def _solo(original: Path, chosen: Path, rows: Path, batch: int, calls: int,
          repeats: int) -> dict[str, Any]:
    """Each file timed alone in a fresh process, alternately (A, B, A, B, ...): the speed-up is
    the median of the ratios of adjacent pairs, so the machine's drift between pairs (other
    tenants of a shared CPU) cancels out."""
    seen: dict[str, list[float]] = {"original": [], "chosen": []}
    for _ in range(repeats):
        for key, path in (("original", original), ("chosen", chosen)):
            out = subprocess.run([sys.executable, "-c", SOLO, str(path), str(rows), str(batch),
                                  str(calls)], capture_output=True, text=True, check=True)
            seen[key].append(float(out.stdout.strip()))
    ratios = np.asarray(seen["original"]) / np.asarray(seen["chosen"])
    return {"speedup": float(np.median(ratios)), "pair_ratios": [round(r, 3) for r in ratios],
            "p50_us": {k: [round(v, 2) for v in vals] for k, vals in seen.items()}}


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--quick", action="store_true", help="smaller models and data")
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--solo-calls", type=int, default=400)
    parser.add_argument("--solo-repeats", type=int, default=7)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    wanted = [m for m in args.only.split(",") if m]
    with tempfile.TemporaryDirectory() as tmp:
        repo = ModelRepository(Path(tmp) / "models")
        for name, spec in _models(args.quick).items():
            if wanted and name not in wanted:
                continue
            data = spec["data"]
            t0 = time.time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est = spec["make"]().fit(*data["train"])
            meta = repo.add_estimator(name, est, data["train"][0][:512])
            repo.promote(name, meta.version)
            print(f"{name}: trained and registered in {time.time() - t0:.0f}s "
                  f"({repo.model_path(name, 1).stat().st_size / 1e6:.1f} MB)", flush=True)
            files = {k: Path(tmp) / f"{name}-{k}.npz" for k in data}
            for k, (xx, yy) in data.items():
                np.savez(files[k], X=xx, y=yy)
            report_path = out / f"new_user_{name}.json"
            _cli(["optimize", "-m", name, "--data", str(files["val"]), "--train-data",
                  str(files["train"]), "-r", str(repo.root), "--json-out", str(report_path),
                  "--markdown", str(out / f"new_user_{name}.md")])
            report = json.loads(report_path.read_text())
            entry: dict[str, Any] = {"chosen": report["chosen"], "reason": report["reason"],
                                     "rejected": report["rejected"], "rows": report["rows"]}
            labels = meta.class_labels
            original = repo.model_path(name, 1).read_bytes()
            x_h, y_h = data["held_out"]
            entry["held_out_original"] = _held_out(original, meta.task, labels, x_h, y_h)
            if report["registered"]:
                version = report["registered"]["version"]
                cand_path = repo.model_path(name, version)
                cand = cand_path.read_bytes()
                chosen = next(c for c in report["candidates"] if c["name"] == report["chosen"])
                entry["held_out_chosen"] = _held_out(cand, meta.task, labels, x_h, y_h)
                entry["report_evaluation"] = chosen["evaluation"]
                entry["speedup_check"] = {}
                for batch in report["batch_sizes"]:
                    solo = _solo(repo.model_path(name, 1), cand_path, files["held_out"], batch,
                                 args.solo_calls, args.solo_repeats)
                    reported = chosen["speedup"][str(batch)]
                    check: dict[str, Any] = {"reported": reported, "solo": solo}
                    if not chosen["settings"]:  # the solo script runs ORT's plain settings
                        check["within_15pct"] = bool(abs(reported / solo["speedup"] - 1) <= 0.15)
                    entry["speedup_check"][str(batch)] = check
            summary[name] = entry
            print(json.dumps({name: entry}, indent=2, default=str), flush=True)
    (out / "new_user.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main_()
