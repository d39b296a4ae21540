"""Live quality: labels that arrive later, joined on request id, against the validation score.

The server keeps each prediction's score under its request id (bounded: the oldest go first,
and none older than a TTL; in this process, or shared by every worker: ``joinstore.py``) until a
label arrives (``POST /v1/labels`` or a review), then moves
the pair into a rolling window and reports ROC AUC, accuracy and log loss (classification) or
RMSE and MAE (regression), beside the version's validation score from its metadata (a
recorded ``roc_auc_holdout`` or ``val_accuracy`` is that figure; ``not_compared`` in the report
names every recorded metric that is none, and why).

Before labels arrive, a calibrated classifier's own probabilities say how well it should be
doing: confidence-based performance estimation (CBPE, as NannyML does) takes the expected
confusion matrix at each threshold from the probabilities themselves. The estimate is computed
over all recent predictions and, separately, over the labelled ones, so it can be shown beside
the realised figure and a user sees how well it tracked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from redline.models.metadata import validation_figures
from redline.monitoring.joinstore import JoinState, MemoryJoin, join_labels

HIGHER_IS_BETTER = {"roc_auc": True, "accuracy": True, "log_loss": False, "rmse": False,
                    "mae": False}
_P_EPS = 1e-15


# ---------------------------------------------------------------------- the metrics
def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Area under the ROC curve (Mann-Whitney, ties averaged); None with one class only."""
    pos = labels == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size)
    sorted_scores = scores[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def classification_metrics(p: np.ndarray, y: np.ndarray) -> dict[str, float | None]:
    pc = np.clip(p, _P_EPS, 1 - _P_EPS)
    return {
        "roc_auc": roc_auc(p, y),
        "accuracy": float(np.mean((p >= 0.5) == (y == 1))),
        "log_loss": float(-np.mean(y * np.log(pc) + (1 - y) * np.log(1 - pc))),
    }


def regression_metrics(pred: np.ndarray, y: np.ndarray) -> dict[str, float | None]:
    err = pred - y
    return {"rmse": float(np.sqrt(np.mean(err ** 2))), "mae": float(np.mean(np.abs(err)))}


def cbpe(p: np.ndarray) -> dict[str, float | None]:
    """Expected ROC AUC, accuracy and log loss if the probabilities ``p`` are calibrated."""
    if p.size == 0:
        return {"roc_auc": None, "accuracy": None, "log_loss": None}
    pc = np.clip(p, _P_EPS, 1 - _P_EPS)
    accuracy = float(np.mean(np.maximum(p, 1 - p)))
    log_loss = float(-np.mean(pc * np.log(pc) + (1 - pc) * np.log(1 - pc)))
    # Expected ROC: sweep the threshold down the sorted scores; each row counts p_i as a positive
    # and 1 - p_i as a negative.
    order = np.argsort(-p, kind="mergesort")
    ps = p[order]
    tp = np.concatenate([[0.0], np.cumsum(ps)])
    fp = np.concatenate([[0.0], np.cumsum(1 - ps)])
    if tp[-1] <= 0 or fp[-1] <= 0:
        auc = None
    else:
        tpr, fpr = tp / tp[-1], fp / fp[-1]
        auc = float(np.sum((fpr[1:] - fpr[:-1]) * (tpr[1:] + tpr[:-1]) / 2))
    return {"roc_auc": auc, "accuracy": accuracy, "log_loss": log_loss}


# ---------------------------------------------------------------------- one model version
class QualityMonitor:
    """The label join and the rolling quality of one model version.

    The join's state (waiting predictions, joined pairs, recent scores) lives in a
    ``JoinState``: this process's memory by default, or a store every worker shares
    (``monitoring/joinstore.py``); the figures are computed here from what it holds."""

    def __init__(self, model: str, version: str, task: str, reference: dict[str, float],
                 join_capacity: int = 100_000, join_ttl_s: float = 7 * 24 * 3600.0,
                 window: int = 5000, tolerance: float = 0.05, state: JoinState | None = None
                 ) -> None:
        self.model, self.version = model, version
        self.classification = task == "classification"
        # the version's recorded metrics by live quality's names (``roc_auc_holdout`` is the
        # roc_auc figure); the others are reported with the reason they are not compared
        self.reference, self.not_compared = validation_figures(reference, task)
        self.join_capacity = join_capacity
        self.join_ttl_s = join_ttl_s
        self.tolerance = tolerance
        self.state: JoinState = state if state is not None else MemoryJoin(
            join_capacity, join_ttl_s, window)

    def predicted(self, request_ids: list[str], scores: np.ndarray) -> None:
        """Keep each prediction's score until its label arrives (bounded)."""
        self.state.predicted(request_ids, scores)

    def label(self, request_id: str, label: float) -> bool:
        """Join one label; False if no prediction with that id is kept."""
        return join_labels([self.state], [request_id], [float(label)]).joined == 1

    def label_score(self, score: float, label: float) -> None:
        """A label whose prediction is known directly (a reviewed request)."""
        self.state.label_score(score, label)

    def label_reviewed(self, request_id: str, score: float | None, label: float) -> str:
        """A reviewer's label, counted once: joined under its request id while the prediction
        waits there; a *duplicate* (not counted) when the request has a label already; else
        paired with the score the review item kept. Returns the outcome, as
        ``redline_labels_total`` counts it."""
        if request_id:
            got = join_labels([self.state], [request_id], [float(label)])
            if got.joined:
                return "joined"
            if got.duplicate:
                return "duplicate"
        if score is None:
            return "unmatched"
        self.state.label_score(score, label)
        return "joined"

    @property
    def pending(self) -> int:
        return self.state.snapshot().pending

    @property
    def evicted(self) -> int:
        return self.state.snapshot().evicted

    def report(self) -> dict[str, Any]:
        snap = self.state.snapshot()
        labelled, recent = snap.labelled, snap.recent
        out: dict[str, Any] = {
            "model": self.model, "version": self.version,
            "task": "classification" if self.classification else "regression",
            "labelled": int(labelled.shape[0]), "pending_join": snap.pending,
            "join_capacity": self.join_capacity, "evicted": snap.evicted,
            "joined": snap.joined, "late_labels": snap.late,
            "reference": self.reference, "not_compared": self.not_compared,
            "tolerance": self.tolerance,
            "higher_is_better": {k: HIGHER_IS_BETTER[k] for k in (
                ("roc_auc", "accuracy", "log_loss") if self.classification else ("rmse", "mae"))},
        }
        realised: dict[str, float | None] = {}
        if labelled.shape[0]:
            s, y = labelled[:, 0], labelled[:, 1]
            realised = (classification_metrics(s, y) if self.classification
                        else regression_metrics(s, y))
        out["realised"] = _round(realised)
        if self.classification:
            out["estimated"] = _round(cbpe(recent))  # all recent predictions
            if labelled.shape[0]:
                out["estimated_on_labelled"] = _round(cbpe(labelled[:, 0]))
        alarms = []
        for metric, ref in self.reference.items():
            value = realised.get(metric)
            if value is None:
                continue
            if HIGHER_IS_BETTER[metric]:
                worse = value < ref * (1 - self.tolerance)
            else:
                worse = value > ref * (1 + self.tolerance)
            if worse:
                alarms.append(metric)
        out["alarms"] = alarms
        out["alarm"] = bool(alarms)
        return out


def _round(d: dict[str, float | None]) -> dict[str, float | None]:
    return {k: (round(v, 5) if v is not None and math.isfinite(v) else None) for k, v in d.items()}
