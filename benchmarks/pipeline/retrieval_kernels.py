"""The exact retrieval's two choices, measured: what searching a batch at once saves, and the
top-k's group size (``redline/models/graph.py``'s ``exact_top_k_rows``).

Batches of 1, 2, 4 and 8 queries: the batch searched at once (one matrix product, then each
query's nearest items scored again row by row: what redline does) against each query searched
alone (one matrix-vector product each), with the same answers bit for bit. Top-k of one query:
``TOP_K_GROUP`` 16 (redline's) against 64. Each pair in alternating order, thread CPU time,
one BLAS thread (as the server runs it); medians in microseconds, and the ratio.

    PYTHONPATH=src:. python benchmarks/pipeline/retrieval_kernels.py \
        [--embeddings examples/recommend/artifacts/items.npy] [--rounds 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from redline.models import graph

Search = Callable[[np.ndarray, np.ndarray, float], object]  # (emb, queries, max_norm)


def batched(emb: np.ndarray, queries: np.ndarray, max_norm: float) -> object:
    return graph.exact_top_k_rows(emb, queries, 100, max_norm)


def one_by_one(emb: np.ndarray, queries: np.ndarray, max_norm: float) -> list[object]:
    return [graph.exact_top_k_rows(emb, q[None, :], 100, max_norm) for q in queries]


def top_k_with(group: int) -> Search:
    def run(emb: np.ndarray, queries: np.ndarray, max_norm: float) -> object:
        kept, graph.TOP_K_GROUP = graph.TOP_K_GROUP, group
        try:
            return graph.exact_top_k_rows(emb, queries, 100, max_norm)
        finally:
            graph.TOP_K_GROUP = kept
    return run


def pair(emb: np.ndarray, n: int, ours: Search, theirs: Search, rounds: int,
         rng: np.random.Generator) -> dict[str, float]:
    """Median thread-CPU µs of ``ours`` and ``theirs`` over ``rounds`` batches of ``n``
    session-like queries (recency-weighted sums of catalogue rows), alternating; the
    catalogue's largest norm computed once, as a server does."""
    max_norm = graph.max_row_norm(emb)
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for r in range(rounds):
        rows = rng.integers(0, len(emb), (n, 10))
        queries = (emb[rows] * (0.8 ** np.arange(10))[None, :, None]).sum(axis=1)
        queries = queries.astype(np.float32)
        for name in (("ours", "theirs") if r % 2 else ("theirs", "ours")):
            fn = ours if name == "ours" else theirs
            t = time.thread_time_ns()
            fn(emb, queries, max_norm)
            times[name].append((time.thread_time_ns() - t) / 1e3)
    a, b = statistics.median(times["ours"]), statistics.median(times["theirs"])
    return {"ours_us": round(a, 1), "theirs_us": round(b, 1), "ratio": round(a / b, 3)}


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--embeddings", type=Path, default=None,
                    help="an items.npy (default: 50,000 x 32 random, unit-scaled)")
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    if args.embeddings is not None:
        emb = np.ascontiguousarray(np.load(args.embeddings), dtype=np.float32)
    else:
        emb = (rng.normal(size=(args.items, 32)) / np.sqrt(32)).astype(np.float32)
    out: dict[str, object] = {"items": emb.shape[0], "dim": emb.shape[1]}
    with threadpool_limits(1):
        out["search of n queries, at once over one by one"] = {
            str(n): pair(emb, n, batched, one_by_one, args.rounds, rng) for n in (1, 2, 4, 8)}
        out["top-k of one query, groups of 16 over 64"] = pair(
            emb, 1, top_k_with(16), top_k_with(64), args.rounds, rng)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
