"""Ranking quality with one held-out next item per request: recall@k and NDCG@k."""

from __future__ import annotations

import numpy as np


def recall_ndcg(ranked: np.ndarray, targets: np.ndarray, k: int = 10) -> tuple[float, float]:
    """``ranked`` [n, >=k] item indices best first; ``targets`` [n]. Mean recall@k and NDCG@k."""
    hits = ranked[:, :k] == targets[:, None]
    found = hits.any(axis=1)
    position = hits.argmax(axis=1)
    ndcg = np.where(found, 1.0 / np.log2(position + 2.0), 0.0)
    return float(found.mean()), float(ndcg.mean())
