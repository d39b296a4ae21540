"""The ranking stage: features of (request, candidate) pairs and a LightGBM ranker in ONNX.

Every feature is one the inference graph computes per candidate (``rank.features`` in
``graph.yaml``): the retrieval score and position, catalogue columns of ``items.parquet``, the
session's length, and the user's activity windows (``features.py``'s ``user_activity`` view,
which the graph's features step reads from the online store for the request's ``user_id``).
The ranker sees the K candidates of one request as one batch.
"""

from __future__ import annotations

import numpy as np

USER_FEATURES = ["user_activity:count_1d", "user_activity:count_7d", "user_activity:cart_sum_7d"]
ITEM_COLUMNS = ["price", "log_popularity", "category_code"]
RANK_FEATURES = ["retrieval:score", "retrieval:position",
                 *(f"item:{c}" for c in ITEM_COLUMNS), "session:length",
                 *(f"entity:{f}" for f in USER_FEATURES)]


def candidate_features(candidates: np.ndarray, scores: np.ndarray, session_length: int,
                       item_columns: np.ndarray, user: np.ndarray) -> np.ndarray:
    """One float32 row per candidate, columns in ``RANK_FEATURES`` order. ``item_columns``
    [n_items, len(ITEM_COLUMNS)]; ``user`` [len(USER_FEATURES)]."""
    k = len(candidates)
    return np.column_stack([
        scores, np.arange(k), item_columns[candidates], np.full(k, session_length),
        np.tile(user, (k, 1)),
    ]).astype(np.float32)


def train_ranker(x: np.ndarray, y: np.ndarray, groups: list[int], *, trees: int = 100,
                 seed: int = 0):  # noqa: ANN201 - lightgbm is imported lazily
    import lightgbm as lgb

    model = lgb.LGBMRanker(n_estimators=trees, num_leaves=15, learning_rate=0.08,
                           min_child_samples=20, subsample=0.8, subsample_freq=1,
                           colsample_bytree=0.9, random_state=seed, n_jobs=2, verbose=-1)
    model.fit(x, y, group=groups)
    return model


def to_onnx(model, n_features: int) -> bytes:  # noqa: ANN001
    """The ranker as ONNX: input ``candidates`` float32 [K, n], output the scores [K, 1]."""
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    onx = onnxmltools.convert_lightgbm(model.booster_, initial_types=[
        ("candidates", FloatTensorType([None, n_features]))], target_opset=15)
    return onx.SerializeToString()
