"""The retrieval-kernel benchmark runs on a small catalogue and reports both comparisons."""

from __future__ import annotations

import numpy as np

from benchmarks.pipeline.retrieval_kernels import main, padded_blocks, per_query


def test_retrieval_kernels_reports_both_choices() -> None:
    out = main(["--items", "3000", "--rounds", "4"])
    scores = out["scores, per-query GEMV over padded 4-query products"]
    assert set(scores) == {"1", "2", "4", "8"}  # type: ignore[arg-type]
    for cell in [*scores.values(), out["top-k of one query, groups of 16 over 64"]]:  # type: ignore[union-attr]
        assert cell["ours_us"] > 0 and cell["theirs_us"] > 0


def test_both_kernels_score_alike_to_float_rounding() -> None:
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(500, 8)).astype(np.float32)
    q = rng.normal(size=(3, 8)).astype(np.float32)
    np.testing.assert_allclose(np.stack(per_query(emb, q)), padded_blocks(emb, q)[:3],
                               rtol=1e-5, atol=1e-5)
