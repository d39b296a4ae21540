"""Per-request cost of each inference-graph step, in process (no server, no network).

A 50,000 x 64 catalogue, K=100 candidates, a 100-tree LightGBM ranker exported to ONNX, a
session of 10 items: the same ``GraphRunner`` the server uses, each step timed alone over many
requests (median and p99 in microseconds), exact and HNSW retrieval side by side, plus the cost
of ``models add`` (index build, recall@K against exact).

    python -m benchmarks.pipeline.graph_steps [--requests 2000] [--items 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from redline.config import Settings
from redline.models import ModelRepository
from redline.models.graph import GraphSpec
from redline.serving.deadline import Budget
from redline.serving.handle import ModelHandle
from redline.serving.predict.graph import GraphRunner
from redline.serving.predict.graph_request import _score
from redline.serving.predict.sessions import SessionItem


def build(folder: Path, items: int, dim: int, k: int, index: str) -> Path:
    import lightgbm as lgb
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from redline.models.convert import convert

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    emb = rng.normal(size=(items, dim)).astype(np.float32) / np.sqrt(dim)
    np.save(folder / "items.npy", emb)
    pq.write_table(pa.table({
        "item_id": [f"i{j}" for j in range(items)],
        "price": rng.gamma(2.0, 20.0, items), "popularity": rng.pareto(1.5, items),
        "in_stock": (rng.random(items) > 0.05).astype(np.int8)}), folder / "items.parquet")
    features = ["retrieval:score", "retrieval:position", "item:price", "item:popularity",
                "session:length", "session:seen", "session:clicks"]
    x = rng.normal(size=(5000, len(features))).astype(np.float32)
    y = x[:, 0] * 2 + x[:, 2] - 0.5 * x[:, 3] + rng.normal(0, 0.3, 5000)
    model = lgb.LGBMRegressor(n_estimators=100, num_leaves=31, verbose=-1).fit(x, y)
    (folder / "ranker.onnx").write_bytes(convert(model, x[:200]).onnx_bytes)
    doc = {"steps": [{"features": {"session_items": 10}},
                     {"retrieve": {"k": k, "index": index}},
                     {"rank": {"model": "ranker.onnx", "features": features}},
                     {"rules": {"drop_seen": True, "in_stock": "in_stock"}}],
           "output": {"top_n": 10}}
    (folder / "graph.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def stats(samples: list[int]) -> tuple[float, float]:
    a = np.asarray(samples) / 1000.0
    return float(np.median(a)), float(np.percentile(a, 99))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--cpu", action="store_true",
                    help="time each step in thread CPU time (robust on a loaded machine) "
                         "instead of wall time")
    ap.add_argument("--json-out", type=Path, help="also write the results here (run_all.py)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    try:
        folder = build(tmp / "g", args.items, args.dim, args.k, "hnsw")
        repo = ModelRepository(tmp / "repo")
        t0 = time.perf_counter()
        meta = repo.add_graph("rec", folder)
        add_s = time.perf_counter() - t0
        vdir = repo.version_dir("rec", meta.version)
        spec = GraphSpec.from_dict(meta.extra["graph"])
        runner = GraphRunner(vdir, spec, "rec")
        exact = GraphRunner(vdir, spec, "rec")
        exact.index = None
        from redline.models.runtime import InferenceSession

        settings = Settings()
        handle = ModelHandle(InferenceSession.load(repo, "rec", meta.version, settings.runtime),
                             settings)
        handle.warm()
        rng = np.random.default_rng(1)
        names = ["query", "retrieve exact", "retrieve hnsw", "rank rows", "ranker run (K rows)",
                 "rank order", "rules"]
        times: dict[str, list[int]] = {n: [] for n in names}
        inp = handle.session.inputs[0].name
        fields = np.zeros(len(spec.fields), dtype=np.float32)
        perf = time.thread_time_ns if args.cpu else time.perf_counter_ns

        async def one(r: int) -> None:
            items = [SessionItem(f"i{j}", "click", 1000 + n)
                     for n, j in enumerate(rng.integers(0, args.items, 10))]
            a = perf()
            q = runner.query(fields, items)
            b = perf()
            exact.retrieve(q)
            c = perf()
            rows, scores = runner.retrieve(q)
            d = perf()
            x = runner.rank_rows(rows, scores, fields, items)
            e = perf()
            out = await handle.infer({inp: x}, Budget(time.perf_counter(), 1000.0, "bench"))
            f = perf()
            ranked = _score(out, handle.output_names, len(rows))
            order = np.argsort(-ranked, kind="stable")
            rows, scores = rows[order], ranked[order]
            g = perf()
            runner.rules(rows, scores, items)
            h = perf()
            if r >= 50:  # warm-up
                for name, ns in zip(names, (b - a, c - b, d - c, e - d, f - e, g - f, h - g),
                                    strict=True):
                    times[name].append(ns)

        async def run_all() -> None:
            for r in range(args.requests + 50):
                await one(r)

        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):  # one request at a time, as the server's event loop runs it
            asyncio.run(run_all())
        print(f"`python -m benchmarks.pipeline.graph_steps --items {args.items} --dim "
              f"{args.dim} --k {args.k} --requests {args.requests}"
              f"{' --cpu' if args.cpu else ''}`\n")
        info = meta.extra["catalogue"]
        print(f"models add: {add_s:.1f} s (HNSW build, M={spec.hnsw_m}); recall@{args.k} "
              f"against exact {info['recall_at_k']:.4f} (efSearch {max(spec.ef_search, spec.k)})"
              "\n")
        clock = "thread CPU" if args.cpu else "wall"
        print(f"| step ({clock} time) | p50 µs | p99 µs |\n| --- | --- | --- |")
        total50 = total99 = 0.0
        for name in names:
            p50, p99 = stats(times[name])
            if name != "retrieve exact":
                total50 += p50
                total99 += p99
            print(f"| {name} | {p50:.0f} | {p99:.0f} |")
        print(f"| all steps, HNSW retrieval (sum) | {total50:.0f} | {total99:.0f} |")
        if args.json_out is not None:
            args.json_out.write_text(json.dumps({
                "clock": clock, "add_s": add_s, "recall": info["recall_at_k"], "k": args.k,
                "ef_search": max(spec.ef_search, spec.k), "hnsw_m": spec.hnsw_m,
                "steps_us": {n: stats(times[n]) for n in names},
                "total_us": [total50, total99]}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
