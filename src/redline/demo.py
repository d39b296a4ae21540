"""``make demo``: the main job end to end on the embedded default (no services needed).

Step 1 trains a small forest on scikit-learn's breast-cancer data, registers it in the repository
under ``.redline/models`` (converted to ONNX, parity-checked), and compares one-row latency of the
original framework with redline's engine.

Step 2 runs the real-time card-fraud example (``examples/fraud``) on the embedded default: it
generates a week of transactions with fraud bursts and delayed labels, builds a point-in-time
training set, trains and registers a LightGBM model pinned to its feature-view versions, serves
it (in-memory online store), backfills the store, replays the most recent transactions through
``/v1/models/fraud/predict`` while ingesting them, and measures the endpoint with redline's load
generator in a separate process.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import threading
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


def demo_dir(root: Path) -> Path:
    """Where the demo leaves real inputs for the docs: next to the repository (.redline/demo)."""
    out = root.parent / "demo"
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_engine_inputs(out: Path, onnx_bytes: bytes, forest: object, x_val: np.ndarray,
                        y_val: np.ndarray, feature_names: list[str]) -> None:
    """The files README.md and docs/ use: an ONNX file, a pickled estimator, rows, a V2 body."""
    import joblib

    (out / "breast_cancer.onnx").write_bytes(onnx_bytes)
    joblib.dump(forest, out / "forest.joblib")
    np.savez(out / "val.npz", X=x_val, y=y_val)
    (out / "sample.npz").write_bytes((out / "val.npz").read_bytes())
    row = [round(float(v), 6) for v in x_val[0]]
    (out / "row.json").write_text(json.dumps([row]) + "\n")
    (out / "features.json").write_text(json.dumps(dict(zip(feature_names, row, strict=True)),
                                                  indent=1) + "\n")
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, len(row)],
                        "data": row}]}
    (out / "infer.json").write_text(json.dumps(body) + "\n")


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
    write_engine_inputs(demo_dir(root), repo.model_path("breast_cancer", meta.version).read_bytes(),
                        forest, x_test, y_test, [str(n) for n in data.feature_names])
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


def _example_dir() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "examples" / "fraud"
        if (candidate / "features.py").exists():
            return candidate
    raise SystemExit("examples/fraud not found: run `make demo` from a checkout of the repository")


def _serve_in_thread(settings: object) -> tuple[object, threading.Thread]:
    """A real server (REST on an ephemeral port) on its own event loop in a thread."""
    import asyncio

    from redline.assembly import build_server

    server = build_server(settings)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(
        server.serve(install_signals=False)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started.is_set():
        if not thread.is_alive() or time.monotonic() > deadline:
            raise SystemExit("the demo server did not start")
        time.sleep(0.02)
    server._demo_loop = loop  # type: ignore[attr-defined]
    return server, thread


def _bench(url: str, body: bytes, concurrency: int, seconds: float) -> dict:
    """``redline bench --v1`` in its own process (never sharing the server's interpreter)."""
    out = subprocess.run(
        [sys.executable, "-m", "redline.cli", "bench", "--url", url, "--model", "fraud",
         "--v1", body.decode(), "--concurrency", str(concurrency), "--duration", str(seconds),
         "--warmup", "1", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    if out.returncode != 0:
        raise SystemExit(f"benchmark failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def fraud_step(root: Path, cards: int, days: float, replay_n: int, bench_s: float
               ) -> dict[str, float]:
    import orjson
    from sklearn.metrics import roc_auc_score

    from redline.config import Settings

    example = _example_dir()
    sys.path.insert(0, str(example))
    import features as fx  # type: ignore[import-not-found]
    import generate  # type: ignore[import-not-found]
    import replay as rp  # type: ignore[import-not-found]
    import train  # type: ignore[import-not-found]

    console.rule("[bold]2. Real-time fraud scoring (examples/fraud)")
    with console.status(f"generating {days:g} days of transactions for {cards} cards…"):
        data = generate.generate(cards, days, seed=7)
    fraud = sum(t["is_fraud"] for t in data.transactions)
    console.print(f"{len(data.transactions)} transactions ({fraud} fraudulent: stolen-card "
                  f"bursts and card testing), {len(data.labels)} labels known so far")
    with console.status("point-in-time training set from the event log, LightGBM, register…"):
        result = train.train(data, root)
    console.print(f"registered [bold]fraud[/] version {result['version']} pinned to its feature "
                  f"views; ROC AUC on the held-out last 2 days: [bold]{result['roc_auc']:.3f}[/] "
                  f"({result['holdout_rows']} transactions, {result['holdout_fraud']} fraud)")

    settings = Settings()
    settings.repository = str(root)
    settings.server.http_port = 0
    settings.server.grpc_enabled = False
    settings.server.watch_repository = False
    settings.features.definitions = str(example / "features.py")
    logging.getLogger("redline").setLevel(logging.ERROR)  # the demo prints its own progress
    with console.status("starting the server (embedded in-memory online store)…"):
        server, thread = _serve_in_thread(settings)
    url = f"http://127.0.0.1:{server.http_port}"  # type: ignore[attr-defined]
    recent = data.transactions[-replay_n:]
    cut = recent[0]["ts"]
    history = [e for t in data.transactions if t["ts"] < cut for e in fx.events_of(t)]
    history += [fx.label_event(r) for r in data.labels if r["ts"] < cut]
    history.sort(key=lambda e: e["ts"])
    ingestor = server.pipeline.ingestor  # type: ignore[attr-defined]
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("backfilling the online store", total=len(history))
        for i in range(0, len(history), 5000):
            chunk = history[i:i + 5000]
            ingestor.ingest(chunk, [e["ts"] for e in chunk])
            progress.update(task, completed=i + len(chunk))
        task = progress.add_task(f"replaying the last {len(recent)} transactions (score, then "
                                 "ingest)", total=len(recent))
        records = rp.replay(url, recent, progress=lambda k: progress.update(task, completed=k))
    labels = [r["is_fraud"] for r in records]
    live_auc = float(roc_auc_score(labels, [r["score"] for r in records])) \
        if 0 < sum(labels) < len(labels) else float("nan")
    degraded = sum(r["degraded"] for r in records)
    auc_text = (f"live ROC AUC {live_auc:.3f} (time-compressed replay, indicative)"
                if live_auc == live_auc else "no fraud among them, so no live ROC AUC")
    console.print(f"replayed {len(records)} transactions ({sum(labels)} fraud) through /v1: "
                  f"{degraded} degraded, {auc_text}")
    body = orjson.dumps({k: v for k, v in fx.request_of(recent[-1]).items() if k != "request_id"})
    with console.status(f"measuring /v1/models/fraud/predict with `redline bench --v1` "
                        f"({bench_s:g} s at concurrency 1, then 8)…"):
        one = _bench(url, body, 1, bench_s)
        many = _bench(url, body, 8, bench_s)
    monitor = server.monitor  # type: ignore[attr-defined]
    if monitor is not None:
        # Every version's drift thresholds kept beside it before the server stops, so each
        # later server of this repository reads them in milliseconds instead of calibrating
        # again (seconds of CPU for breast_cancer's 30 features: cut short with its server).
        with console.status("keeping each model version's drift thresholds beside it…"):
            monitor.prepare_loaded(wait=True)
    server.stop()  # type: ignore[attr-defined]
    thread.join(30)
    write_fraud_inputs(demo_dir(root), root, example, data, fx)
    table = Table(title="/v1/models/fraud/predict (features + transforms + model), one process")
    for col in ("clients", "requests/s", "p50 ms", "p99 ms", "errors"):
        table.add_column(col, justify="right")
    for label, r in (("1", one), ("8", many)):
        table.add_row(label, f"{r['throughput_rps']:.0f}", f"{r['latency_ms']['p50']:.2f}",
                      f"{r['latency_ms']['p99']:.2f}", str(sum(r["errors"].values())))
    console.print(table)
    return {"roc_auc": result["roc_auc"], "live_auc": live_auc,
            "p50_ms": one["latency_ms"]["p50"], "p99_ms": one["latency_ms"]["p99"],
            "rps_1": one["throughput_rps"], "rps_8": many["throughput_rps"]}


def write_fraud_inputs(out: Path, root: Path, example: Path, data: object, fx: object) -> None:
    """What `redline serve --config .redline/demo/redline.yaml` needs to serve the fraud model
    as the demo did: every event (replayed into the memory store at start), a config, and a real
    request for a card the history knows."""
    import os

    import orjson

    txns = data.transactions  # type: ignore[attr-defined]
    events = [e for t in txns for e in fx.events_of(t)]  # type: ignore[attr-defined]
    events += [fx.label_event(r) for r in data.labels]  # type: ignore[attr-defined]
    events.sort(key=lambda e: e["ts"])
    with open(out / "fraud-events.jsonl", "wb") as f:
        for e in events:
            f.write(orjson.dumps(e) + b"\n")
    # The last stolen card's last large charge, scored once more a minute later.
    cash_outs = [t for t in txns if t.get("kind") == "cash_out"] or txns
    last = cash_outs[-1]
    later = {**last, "ts": last["ts"] + 60_000}
    request = fx.request_of(later)  # type: ignore[attr-defined]
    request.pop("request_id", None)
    (out / "fraud-request.json").write_text(json.dumps(request) + "\n")
    rel = os.path.relpath
    (out / "redline.yaml").write_text(
        "# Written by `make demo`: serve what the demo built, fraud example included, on the\n"
        "# embedded memory store (one process). Paths are relative to this file.\n"
        "#   redline serve --config .redline/demo/redline.yaml\n"
        f"project: {rel(root.resolve().parent, out.resolve())}\n"
        f"repository: {rel(root.resolve(), out.resolve())}\n"
        "features:\n"
        f"  definitions: {rel((example / 'features.py').resolve(), out.resolve())}\n"
        "  store: memory\n"
        "  preload: fraud-events.jsonl   # replayed into the memory store at start\n"
        "models:\n  fraud:\n    slo_ms: 20\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", default=".redline/models")
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per engine")
    parser.add_argument("--cards", type=int, default=2000, help="fraud example: cards")
    parser.add_argument("--days", type=float, default=8, help="fraud example: days of history")
    parser.add_argument("--replay", type=int, default=3000, help="transactions replayed via /v1")
    parser.add_argument("--bench-seconds", type=float, default=5.0)
    parser.add_argument("--skip-engine", action="store_true", help="run step 2 only")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if not args.skip_engine:
        engine_step(Path(args.repository), args.calls)
    fraud = fraud_step(Path(args.repository), args.cards, args.days, args.replay,
                       args.bench_seconds)
    console.rule("[bold]summary")
    console.print(
        f"fraud model: ROC AUC [bold]{fraud['roc_auc']:.3f}[/] on the held-out period; "
        f"/v1 predict p50 [bold]{fraud['p50_ms']:.2f} ms[/], p99 [bold]{fraud['p99_ms']:.2f} "
        f"ms[/] at 1 client, [bold]{fraud['rps_8']:.0f} req/s[/] at 8 clients "
        f"(demo took {time.perf_counter() - started:.0f} s)"
    )
    out = demo_dir(Path(args.repository))
    console.print(
        f"inputs for the docs in [bold]{out}[/] (model, rows, val.npz, requests). Serve all of "
        f"it: [bold]redline serve --config {out}/redline.yaml[/]"
    )
    console.print(
        "next: [bold]README.md[/] (call it), [bold]docs/your-own-model.md[/], "
        "[bold]examples/fraud/README.md[/] (Redis and replicas), [bold]docs/pipeline.md[/], "
        "[bold]docs/performance.md[/]"
    )


if __name__ == "__main__":
    main()
