"""Quality: the label join and its memory bound, rolling metrics, CBPE before labels, alarms."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from redline.monitoring.quality import QualityMonitor, cbpe, roc_auc


def test_auc_matches_scikit_learn_with_ties() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 500)
    s = np.round(rng.random(500) * 0.5 + y * 0.3, 1)
    assert roc_auc(s, y) == pytest.approx(roc_auc_score(y, s))


def test_join_on_request_id_and_rolling_metrics() -> None:
    q = QualityMonitor("m", "1", "classification", {"roc_auc": 0.9, "accuracy": 0.8})
    rng = np.random.default_rng(1)
    p = rng.random(2000)
    y = (rng.random(2000) < p).astype(float)
    q.predicted([f"r{i}" for i in range(2000)], p)
    assert not q.label("nope", 1)
    for i in range(2000):
        assert q.label(f"r{i}", y[i])
    assert not q.label("r0", 1)  # joined once only
    r = q.report()
    assert r["labelled"] == 2000 and r["pending_join"] == 0
    assert r["realised"]["roc_auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-5)
    assert r["realised"]["log_loss"] == pytest.approx(log_loss(y, p), abs=1e-5)
    # calibrated probabilities: the estimate made before labels tracks the realised figure
    assert r["estimated"]["roc_auc"] == pytest.approx(r["realised"]["roc_auc"], abs=0.03)
    assert r["estimated"]["accuracy"] == pytest.approx(r["realised"]["accuracy"], abs=0.03)
    assert r["estimated_on_labelled"]["log_loss"] == pytest.approx(r["realised"]["log_loss"],
                                                                   abs=0.05)


def test_join_memory_is_bounded() -> None:
    q = QualityMonitor("m", "1", "classification", {}, join_capacity=1000)
    for start in range(0, 10_000, 500):
        q.predicted([f"r{i}" for i in range(start, start + 500)], np.full(500, 0.5))
    assert q.pending == 1000 and q.evicted == 9000
    assert not q.label("r0", 1) and q.label("r9999", 1)


def test_alarm_when_quality_falls_below_validation() -> None:
    q = QualityMonitor("m", "1", "classification", {"roc_auc": 0.95}, tolerance=0.05)
    rng = np.random.default_rng(2)
    p = rng.random(1000)
    y = rng.integers(0, 2, 1000).astype(float)  # labels unrelated to scores: AUC ~0.5
    q.predicted([str(i) for i in range(1000)], p)
    for i in range(1000):
        q.label(str(i), y[i])
    r = q.report()
    assert r["alarm"] and r["alarms"] == ["roc_auc"]


def test_validation_metrics_named_for_their_split_are_the_reference() -> None:
    """The fraud example records ``roc_auc_holdout``: that is the roc_auc figure, so a fall in
    live AUC alarms; what live quality does not compute is named with the reason."""
    q = QualityMonitor("fraud", "1", "classification",
                       {"roc_auc_holdout": 0.93, "average_precision_holdout": 0.61,
                        "roc_auc_train": 0.99, "val_accuracy": 0.9, "rmse": 0.3})
    rng = np.random.default_rng(3)
    p = rng.random(1000)
    q.predicted([str(i) for i in range(1000)], p)
    for i in range(1000):
        q.label(str(i), float(i % 2))  # labels unrelated to the scores: AUC about 0.5
    r = q.report()
    assert r["reference"] == {"roc_auc": 0.93, "accuracy": 0.9}
    assert r["alarm"] and "roc_auc" in r["alarms"]
    assert set(r["not_compared"]) == {"average_precision_holdout", "roc_auc_train", "rmse"}
    assert "roc_auc, accuracy, log_loss" in r["not_compared"]["average_precision_holdout"]


def test_regression_metrics() -> None:
    q = QualityMonitor("m", "1", "regression", {"rmse": 1.0, "mae": 1.0})
    q.predicted(["a", "b"], np.array([1.0, 3.0]))
    q.label("a", 2.0)
    q.label("b", 3.0)
    r = q.report()
    assert r["realised"] == {"rmse": pytest.approx(np.sqrt(0.5), abs=1e-5), "mae": 0.5}
    assert not r["alarm"] and "estimated" not in r


def test_cbpe_of_certain_predictions() -> None:
    est = cbpe(np.array([0.0, 0.0, 1.0, 1.0]))
    assert est["accuracy"] == 1.0 and est["roc_auc"] == 1.0


def test_a_label_after_its_prediction_left_counts_as_late_not_unmatched() -> None:
    from redline.monitoring.joinstore import join_labels

    q = QualityMonitor("m", "1", "classification", {}, join_capacity=100)
    q.predicted([f"r{i}" for i in range(300)], np.full(300, 0.5))  # r0..r199 leave
    # the last 100 ids that left are remembered (r100..r199): late; r0 is forgotten: unmatched
    got = join_labels([q.state], ["r150", "r0", "r299", "x"], [1.0] * 4)
    assert (got.joined, got.unmatched, got.late, got.duplicate) == (1, ["r0", "x"], 1, 0)
    assert q.report()["late_labels"] == 1 and q.report()["evicted"] == 200
