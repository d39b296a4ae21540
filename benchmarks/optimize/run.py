"""Benchmark: what `redline optimize` buys on a 512-256 MLP and a 500-tree forest (digits).

Trains both models, registers them in a scratch repository and runs the real CLI on each, with
the training rows as tuning data (--train-data) and held-out rows for every reported number.
Every candidate is measured in the same interleaved run as the original, so the speed-ups are
ratios under identical conditions. Targets: int8 >= 1.5x faster at batch 32 on the
MLP within 1% accuracy; a distilled student >= 10x faster per row than the forest at batch 32
within 1% accuracy.

    taskset -c 0 .venv/bin/python benchmarks/optimize/run.py [--rounds 2000] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from redline.cli import main
from redline.models import ModelRepository


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1200], y[:1200], x[1200:], y[1200:]


def _cli(args: list[str]) -> None:
    print("$ redline " + " ".join(args), flush=True)
    try:
        main(args)
    except SystemExit as exc:
        if exc.code:
            raise


def _summary(report: dict, name: str) -> dict:
    return next(c for c in report["candidates"] if c["name"] == name)


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    x_train, y_train, x_val, y_val = _data()
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.neural_network import MLPClassifier

    t0 = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp = MLPClassifier((512, 256), max_iter=60, random_state=0).fit(x_train, y_train)
    forest = RandomForestClassifier(500, random_state=0, n_jobs=1).fit(x_train, y_train)
    print(f"trained both models in {time.time() - t0:.0f}s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = ModelRepository(Path(tmp) / "models")
        repo.add_estimator("mlp", mlp, x_train[:256])
        repo.add_estimator("forest", forest, x_train[:256])
        train, val = Path(tmp) / "train.npz", Path(tmp) / "val.npz"
        np.savez(train, X=x_train, y=y_train)
        np.savez(val, X=x_val, y=y_val)
        common = ["--data", str(val), "--train-data", str(train), "-r", str(repo.root),
                  "--rounds", str(args.rounds), "--max-seconds", str(args.max_seconds),
                  "--batch-size", "32", "--no-register"]
        _cli(["optimize", "mlp", *common, "--techniques", "graph,quantize,prune,magnitude,distill",
              "--json-out", str(out / "mlp.json"), "--markdown", str(out / "mlp.md")])
        _cli(["optimize", "forest", *common, "--techniques", "graph,trees,distill",
              "--json-out", str(out / "forest.json"), "--markdown", str(out / "forest.md")])
    mlp_report = json.loads((out / "mlp.json").read_text())
    forest_report = json.loads((out / "forest.json").read_text())
    print("\n== targets ==")
    for name in ("int8-dynamic", "int8-static-minmax", "int8-static-entropy",
                 "int8-static-percentile"):
        try:
            c = _summary(mlp_report, name)
        except StopIteration:
            continue
        print(f"MLP {name}: {c['speedup']['32']:.2f}x at batch 32 (target 1.5x), "
              f"{c['speedup']['1']:.2f}x at batch 1, accuracy change {-c['metric_loss']:+.2%}")
    base = _summary(forest_report, "original")
    for c in forest_report["candidates"]:
        if c["technique"] != "distill":
            continue
        per_row = base["latency"]["32"]["per_row_us"] / c["latency"]["32"]["per_row_us"]
        print(f"forest -> {c['name']}: {per_row:.1f}x faster per row at batch 32 (target 10x), "
              f"{c['speedup']['1']:.1f}x at batch 1, accuracy change {-c['metric_loss']:+.2%}")


if __name__ == "__main__":
    main_()
