"""One-row latency: scikit-learn vs redline's engine (ONNX Runtime) on the demo forest.

Same model, same row, same process, measured in one run so the ratio holds on a noisy machine.

    .venv/bin/python benchmarks/models/engine_latency.py [--calls 5000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.ensemble import RandomForestClassifier

from redline.models import InferenceSession, ModelRepository


def measure(fn, calls: int) -> np.ndarray:
    for _ in range(min(calls // 10, 200)):
        fn()
    out = np.empty(calls)
    for i in range(calls):
        t = time.perf_counter_ns()
        fn()
        out[i] = (time.perf_counter_ns() - t) / 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    x, y = load_breast_cancer(return_X_y=True)
    x = x.astype(np.float32)
    forest = RandomForestClassifier(n_estimators=100, max_depth=8, random_state=0).fit(x, y)
    repo = ModelRepository(tempfile.mkdtemp())
    repo.add_estimator("rf", forest, x)
    session = InferenceSession.load(repo, "rf")
    session.warmup()
    row = x[:1]
    feed = session.validate({session.inputs[0].name: row})
    rows = {
        "scikit-learn predict_proba": measure(lambda: forest.predict_proba(row), args.calls // 5),
        "redline run (validated feed)": measure(lambda: session.run(feed), args.calls),
        "redline validate + run": measure(
            lambda: session.run(session.validate({session.inputs[0].name: row})), args.calls
        ),
    }
    result = {"cpus": sorted(os.sched_getaffinity(0)), "rows": {}}
    print(f"{'what':<32} {'calls':>6} {'p50 us':>9} {'p99 us':>9}")
    for name, s in rows.items():
        p50, p99 = float(np.percentile(s, 50)), float(np.percentile(s, 99))
        result["rows"][name] = {"calls": int(s.size), "p50_us": p50, "p99_us": p99}
        print(f"{name:<32} {s.size:>6} {p50:>9.1f} {p99:>9.1f}")
    base = result["rows"]["scikit-learn predict_proba"]["p50_us"]
    ours = result["rows"]["redline run (validated feed)"]["p50_us"]
    print(f"speed-up at p50: {base / ours:.0f}x")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
