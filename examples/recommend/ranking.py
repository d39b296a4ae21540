"""The ranking stage: features of (request, candidate) pairs and a LightGBM ranker in ONNX.

A candidate's features are its retrieval score, its item features (catalogue attributes and the
``item_activity`` windows as of the request), how it relates to the session (same category as
the last item, share of the session in its category, price against the session's mean price,
session length) and the user's windows. The ranker sees the K candidates of one request as one
batch.
"""

from __future__ import annotations

import numpy as np

# Feature views of features.py that the ranker reads (kept here: the peer benchmark imports this
# module without redline).
ITEM_FEATURES = ["item_activity:count_1h", "item_activity:count_1d", "item_activity:count_7d",
                 "item_activity:cart_sum_1d"]
USER_FEATURES = ["user_activity:count_1d", "user_activity:count_7d", "user_activity:cart_sum_7d"]
RANK_FEATURES = ["retrieval_score", *ITEM_FEATURES, "price", "log_popularity",
                 "same_category_as_last", "session_category_share", "price_vs_session",
                 "session_length", *USER_FEATURES]


def candidate_features(candidates: np.ndarray, scores: np.ndarray, session: list[int],
                       item_windows: np.ndarray, user_windows: np.ndarray,
                       category: np.ndarray, price: np.ndarray,
                       popularity: np.ndarray) -> np.ndarray:
    """One float32 row per candidate, columns in ``RANK_FEATURES`` order.

    ``session``: the session's item indices, most recent first; ``item_windows`` [K, 4] the
    candidates' ``item_activity`` values; ``user_windows`` [3] the user's."""
    k = len(candidates)
    cand_cat = category[candidates]
    if session:
        sess_cat = category[np.asarray(session)]
        same_last = (cand_cat == sess_cat[0]).astype(np.float32)
        share = (cand_cat[:, None] == sess_cat[None, :]).mean(axis=1)
        vs_price = price[candidates] / float(np.mean(price[np.asarray(session)]))
    else:
        same_last = share = np.zeros(k)
        vs_price = np.ones(k)
    return np.column_stack([
        scores, item_windows, price[candidates], np.log(popularity[candidates]), same_last,
        share, vs_price, np.full(k, len(session)), np.tile(user_windows, (k, 1)),
    ]).astype(np.float32)


def train_ranker(x: np.ndarray, y: np.ndarray, groups: list[int], *, trees: int = 100,
                 seed: int = 0):  # noqa: ANN201 - lightgbm is imported lazily
    import lightgbm as lgb

    model = lgb.LGBMRanker(n_estimators=trees, num_leaves=31, learning_rate=0.08,
                           min_child_samples=20, subsample=0.8, subsample_freq=1,
                           colsample_bytree=0.9, random_state=seed, n_jobs=2, verbose=-1)
    model.fit(x, y, group=groups)
    return model


def to_onnx(model, n_features: int) -> bytes:  # noqa: ANN001
    """The ranker as ONNX: input ``candidates`` float32 [K, n], output ``scores`` float32 [K, 1]."""
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    onx = onnxmltools.convert_lightgbm(model.booster_, initial_types=[
        ("candidates", FloatTensorType([None, n_features]))], target_opset=15)
    onx.graph.output[0].name = onx.graph.output[0].name  # one output: the scores
    return onx.SerializeToString()
