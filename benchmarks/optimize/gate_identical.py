"""Benchmark: does noise pass for a difference? An identical build through `redline gate` many
times, and `redline optimize` on a model whose only candidates are runtime settings, with
several seeds.

Two models on scikit-learn's digits: a 64-unit MLP and a 200-tree random forest. Each is
registered twice with the same bytes (v1 promoted to production, v2 the "candidate"); the real
CLI gates v2 against production ``--runs`` times with default options, each in a fresh process.
Every run must pass (exit 0). Beside the verdict, each run records the pooled p50 ratio, which
the slowdown check used to be judged on alone, and whether that rule would have failed it.
Then ``redline optimize --techniques graph --no-register`` runs with ``--seeds`` seeds: what it
chose and with which interval, so a reader sees whether seeds agree.

    .venv/bin/python benchmarks/optimize/gate_identical.py [--runs 20] [--seeds 3] [--out DIR]

Writes ``gate_identical.json`` under ``--out`` (default: benchmarks/optimize/results).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from redline.models import ModelRepository

LIMIT = 1.2  # the gate's default --max-slowdown


def _models(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.neural_network import MLPClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp = MLPClassifier((64,), max_iter=60, random_state=0).fit(x, y)
    forest = RandomForestClassifier(200, random_state=0).fit(x, y)
    return {"mlp": mlp, "forest": forest}


def _redline(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "redline.cli", *args], capture_output=True,
                          text=True, timeout=600)


def _gate_runs(repo: Path, name: str, data: Path, runs: int) -> dict[str, Any]:
    rows = []
    for i in range(runs):
        done = _redline(["gate", "-m", name, "--candidate", "2", "--data", str(data),
                         "-r", str(repo), "--json"])
        result = json.loads(done.stdout)
        check = next(c for c in result["checks"] if c["name"] == "slowdown")
        pooled = result["measured"]["candidate"]["p50_ms"] / \
            result["measured"]["baseline"]["p50_ms"]
        rows.append({"exit": done.returncode, "ratio": round(check["measured"], 4),
                     "interval": check["interval"], "pooled_p50_ratio": round(pooled, 4),
                     "pooled_rule_fails": pooled > LIMIT})
        print(f"{name} run {i + 1:2}: exit {done.returncode}, slowdown {check['measured']:.3f}x "
              f"{check['interval']}, pooled p50 ratio {pooled:.3f}x", flush=True)
    ratios = [r["ratio"] for r in rows]
    return {"runs": rows, "passed": sum(r["exit"] == 0 for r in rows), "of": runs,
            "pooled_rule_would_fail": sum(r["pooled_rule_fails"] for r in rows),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "highest_interval_low": max(r["interval"][0] for r in rows)}


def _optimize_seeds(repo: Path, name: str, data: Path, seeds: int) -> list[dict[str, Any]]:
    out = []
    for seed in range(seeds):
        done = _redline(["optimize", "-m", name, "--data", str(data), "-r", str(repo),
                         "--techniques", "graph", "--no-register", "--json",
                         "--seed", str(seed)])
        report = json.loads(done.stdout)
        speeds = {c["name"]: {"speedup": c["speedup"], "interval": c["speedup_interval"]}
                  for c in report["candidates"] if c["name"] != "original"}
        out.append({"seed": seed, "chosen": report["chosen"], "reason": report["reason"],
                    "candidates": speeds})
        print(f"{name} optimize seed {seed}: chosen {report['chosen']} — {report['reason']}",
              flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    results: dict[str, Any] = {"limit": LIMIT, "runs": args.runs}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        repo = ModelRepository(root)
        gate_rows, val_rows = Path(tmp) / "gate.npz", Path(tmp) / "val.npz"
        np.savez(gate_rows, X=x[1400:], y=y[1400:])
        np.savez(val_rows, X=x[1000:1400], y=y[1000:1400])
        for name, model in _models(x[:1000], y[:1000]).items():
            repo.add_estimator(name, model, x[:64])
            repo.promote(name, 1)
            repo.add_onnx(name, repo.model_path(name, 1), class_labels=list(range(10)))
            results[name] = {"gate": _gate_runs(root, name, gate_rows, args.runs),
                             "optimize": _optimize_seeds(root, name, val_rows, args.seeds)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gate_identical.json").write_text(json.dumps(results, indent=2) + "\n")
    for name in ("mlp", "forest"):
        g = results[name]["gate"]
        print(f"{name}: identical build passed {g['passed']} of {g['of']} gates; slowdown "
              f"{g['ratio_min']:.3f}-{g['ratio_max']:.3f}x; the pooled-p50 rule alone would "
              f"have failed {g['pooled_rule_would_fail']}")


if __name__ == "__main__":
    main()
