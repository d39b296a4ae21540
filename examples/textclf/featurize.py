"""The hashing featurizer: a ticket's tokens counted into BUCKETS columns, L2-normalised.

The same function builds the training matrix (``train.py``) and runs as the graph's first step
(``graph.yaml``'s ``features``: ``steps.py`` imports this file), so training = serving by
construction. A token's column is its CRC-32 modulo BUCKETS: stable across processes and
machines, unlike Python's salted ``hash``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np

BUCKETS = 1024


def featurize(texts: Iterable[str | bytes]) -> np.ndarray:
    """Rows of hashed token counts (float32, L2-normalised) for ``texts``."""
    texts = list(texts)
    x = np.zeros((len(texts), BUCKETS), dtype=np.float32)
    for i, text in enumerate(texts):
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        for token in text.lower().split():
            x[i, zlib.crc32(token.encode()) % BUCKETS] += 1.0
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)
