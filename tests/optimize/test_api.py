"""The Python API on a regression model and the metric helpers (RMSE, ROC AUC, log loss)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

from redline.errors import InvalidInput
from redline.optimize import OptimizeOptions, optimize
from redline.optimize.profile import Outputs, roc_auc, task_metrics


def test_optimize_a_regressor_by_rmse(onnx_of):
    from sklearn.datasets import load_diabetes
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = load_diabetes(return_X_y=True)
    x = x.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        regressor = MLPRegressor(hidden_layer_sizes=(32,), max_iter=300, random_state=0,
                                 learning_rate_init=0.01)
        model = make_pipeline(StandardScaler(), regressor).fit(x, y)
    data = onnx_of(model, x)
    report = optimize(data, x[200:], y[200:], task="regression", class_labels=None,
                      options=OptimizeOptions(techniques=["quantize", "prune", "distill"],
                                              tolerance=0.05, fast=True, rounds=20, passes=2),
                      tune=(x[:200], y[:200]))
    assert report.metric == "rmse"
    original = report.result("original")
    for result in report.results:
        assert set(result.metrics) == {"rmse"} and result.metrics["rmse"] > 0
        rel = (result.metrics["rmse"] - original.metrics["rmse"]) / original.metrics["rmse"]
        assert result.metric_loss == pytest.approx(rel)  # evaluation rows
        low, high = result.intervals["rmse"].low, result.intervals["rmse"].high
        assert low <= result.metrics["rmse"] <= high
        # within tolerance is decided on the choice rows, by the interval's worse end
        assert result.within_tolerance == (result.choice.interval.high <= 0.05)
        assert result.choice.interval.low <= result.choice.loss <= result.choice.interval.high
    student = report.result("distill-mlp-32")
    outputs = [o.name for o in onnx.load_from_string(student.candidate.onnx_bytes).graph.output]
    assert outputs == ["variable"]
    assert report.rows == {"fit": 200, "choice": 121, "evaluation": 121}


def test_metrics_match_their_definitions():
    y = np.array([0, 1, 1, 0, 1])
    p1 = np.array([0.1, 0.8, 0.3, 0.35, 0.9])
    out = Outputs(np.column_stack([1 - p1, p1]), np.array([0, 1, 0, 0, 1]))
    metrics = task_metrics("classification", out, y, [0, 1])
    assert metrics["accuracy"] == pytest.approx(0.8)
    # 5 of the 6 positive/negative pairs are ordered right (0.3 < 0.35 is not)
    assert metrics["roc_auc"] == pytest.approx(5 / 6)
    expected = -np.mean(np.log([0.9, 0.8, 0.3, 0.65, 0.9]))
    assert metrics["log_loss"] == pytest.approx(expected)
    assert roc_auc(np.array([True, False]), np.array([0.5, 0.5])) == pytest.approx(0.5)
    reg = task_metrics("regression", Outputs(np.array([[1.0], [3.0]])), np.array([2.0, 3.0]),
                       None)
    assert reg["rmse"] == pytest.approx(np.sqrt(0.5))
    with pytest.raises(InvalidInput, match="not among|2 column"):
        task_metrics("regression", Outputs(np.ones((2, 1))), np.ones((2, 2)), None)


def test_options_are_checked():
    with pytest.raises(InvalidInput, match="unknown technique"):
        OptimizeOptions(techniques=["quantise"])
    with pytest.raises(InvalidInput, match="fit and choice shares"):
        OptimizeOptions(fit_share=0.5, choice_share=0.5)


@pytest.mark.slow
def test_optimize_a_pytorch_model_keeps_its_signature(digits):
    torch = pytest.importorskip("torch")
    from torch import nn

    from redline.models.convert import convert

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    x = torch.as_tensor(digits.x_train)
    target = torch.as_tensor(digits.y_train, dtype=torch.long)
    for _ in range(60):  # a quick full-batch fit: logits for 10 digits
        optimizer.zero_grad()
        nn.functional.cross_entropy(module(x), target).backward()
        optimizer.step()
    data = convert(module, digits.x_train[:16]).onnx_bytes
    # judged as a 10-output regressor against one-hot targets (RMSE), as registered
    one_hot = np.eye(10)
    report = optimize(data, digits.x_val, one_hot[digits.y_val], task="regression",
                      class_labels=None,
                      options=OptimizeOptions(techniques=["quantize", "prune", "distill"],
                                              tolerance=0.5, fast=True, rounds=20, passes=2),
                      tune=(digits.x_train, one_hot[digits.y_train]))
    names = {r.name for r in report.results}
    assert {"int8-dynamic", "prune-50", "distill-mlp-32"} <= names
    for name in ("prune-50", "distill-mlp-32"):
        graph = onnx.load_from_string(report.result(name).candidate.onnx_bytes).graph
        assert [i.name for i in graph.input] == ["input"]
        assert [o.name for o in graph.output] == ["output"]
    pruned = onnx.load_from_string(report.result("prune-50").candidate.onnx_bytes)
    sizes = {i.name: list(i.dims) for i in pruned.graph.initializer}
    assert sorted(sizes.values()) == sorted([[16, 64], [16], [10, 16], [10]])  # Gemm, transB
