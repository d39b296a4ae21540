"""The retrieval-kernel benchmark runs on a small catalogue and reports both comparisons."""

from __future__ import annotations

import numpy as np

from benchmarks.pipeline.retrieval_kernels import batched, main, one_by_one
from redline.models.graph import max_row_norm


def test_retrieval_kernels_reports_both_choices() -> None:
    out = main(["--items", "3000", "--rounds", "4"])
    searches = out["search of n queries, at once over one by one"]
    assert set(searches) == {"1", "2", "4", "8"}  # type: ignore[arg-type]
    for cell in [*searches.values(), out["top-k of one query, groups of 16 over 64"]]:  # type: ignore[union-attr]
        assert cell["ours_us"] > 0 and cell["theirs_us"] > 0


def test_both_ways_find_the_same_items_bit_for_bit() -> None:
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(5000, 8)).astype(np.float32)
    q = rng.normal(size=(6, 8)).astype(np.float32)
    norm = max_row_norm(emb)
    rows, scores = batched(emb, q, norm)  # type: ignore[misc]
    for i, (alone_rows, alone_scores) in enumerate(one_by_one(emb, q, norm)):  # type: ignore[misc]
        assert np.array_equal(rows[i], alone_rows[0])
        assert scores[i].tobytes() == alone_scores[0].tobytes()
