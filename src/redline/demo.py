"""``make demo``: the main job end to end on the embedded default (no services needed).

Step 1 trains a small forest on scikit-learn's breast-cancer data, registers it in the repository
under ``.redline/models`` (converted to ONNX, parity-checked), and compares one-row latency of the
original framework with redline's engine.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

console = Console()


def time_calls(fn: Callable[[], object], calls: int, label: str, progress: Progress) -> np.ndarray:
    """Per-call latency in microseconds, measured one call at a time."""
    task = progress.add_task(label, total=calls)
    samples = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter_ns()
        fn()
        samples[i] = (time.perf_counter_ns() - start) / 1000
        if i % 50 == 0:
            progress.update(task, completed=i)
    progress.update(task, completed=calls)
    return samples


def engine_step(root: Path, calls: int) -> dict[str, float]:
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import train_test_split

    from redline.models import InferenceSession, ModelRepository

    console.rule("[bold]1. Model repository and engine")
    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, data.target, random_state=0)
    with console.status("training a 100-tree forest (depth 8) on breast cancer…"):
        forest = RandomForestClassifier(n_estimators=100, max_depth=8, random_state=0)
        forest.fit(x_train, y_train)
    auc = float(roc_auc_score(y_test, forest.predict_proba(x_test)[:, 1]))
    repo = ModelRepository(root)
    with console.status("converting to ONNX (parity-checked) and registering…"):
        meta = repo.add_estimator(
            "breast_cancer",
            forest,
            x_train,
            feature_names=list(data.feature_names),
            metrics={"roc_auc": auc},
            description="make demo: 100-tree forest",
        )
        repo.promote("breast_cancer", meta.version)
    console.print(
        f"registered [bold]breast_cancer[/] version {meta.version} in {root} "
        f"(ROC AUC {auc:.3f}, conversion max |diff| {meta.extra['conversion_max_abs_diff']:.1e})"
    )
    session = InferenceSession.load(repo, "breast_cancer")
    session.warmup()
    row = x_test[:1]
    feed = session.validate({session.inputs[0].name: row})
    with Progress(console=console, transient=True) as progress:
        sk = time_calls(
            lambda: forest.predict_proba(row),
            max(calls // 5, 200),
            "scikit-learn predict_proba",
            progress,
        )
        rl = time_calls(lambda: session.run(feed), calls, "redline engine (ONNX Runtime)", progress)
    table = Table(title="one-row latency, same model (µs)")
    for col in ("engine", "calls", "p50", "p99"):
        table.add_column(col, justify="right" if col != "engine" else "left")
    for name, s in (("scikit-learn predict_proba", sk), ("redline (ONNX Runtime)", rl)):
        table.add_row(
            name, str(s.size), f"{np.percentile(s, 50):.1f}", f"{np.percentile(s, 99):.1f}"
        )
    console.print(table)
    speedup = float(np.percentile(sk, 50) / np.percentile(rl, 50))
    console.print(f"redline's engine is [bold green]{speedup:.0f}x[/] faster at the median.")
    return {
        "sklearn_p50_us": float(np.percentile(sk, 50)),
        "redline_p50_us": float(np.percentile(rl, 50)),
        "speedup": speedup,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", default=".redline/models")
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per engine")
    args = parser.parse_args(argv)
    engine_step(Path(args.repository), args.calls)
    console.rule()
    console.print(
        "next: [bold]redline models list[/], [bold]redline predict -m breast_cancer "
        "-i '[[...30 numbers...]]'[/], [bold]redline serve[/]"
    )


if __name__ == "__main__":
    main()
