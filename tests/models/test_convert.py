"""Conversion parity: each framework's model and its ONNX twin agree on held-out rows.

The converted bytes are run by a fresh onnxruntime session here (independently of the parity
check inside ``convert``), so a converter that silently changed the numbers would fail.
"""

from __future__ import annotations

from typing import Any

import lightgbm as lgb
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import xgboost as xgb
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits
from sklearn.ensemble import (
    GradientBoostingClassifier,
    HistGradientBoostingClassifier,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from redline.errors import ConversionError
from redline.models.convert import ConvertedModel, convert, detect_framework, from_sklearn, parity
from redline.models.convert.frameworks import import_framework
from redline.models.convert.patches import floor32_thresholds


def _split(x: np.ndarray, y: np.ndarray, n_test: int = 60) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(x))
    test, train = idx[:n_test], idx[n_test:]
    return x[train].astype(np.float32), y[train], x[test].astype(np.float32), y[test]


@pytest.fixture(scope="module")
def cancer() -> tuple[np.ndarray, ...]:
    data = load_breast_cancer()
    return _split(data.data, data.target)


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, ...]:
    data = load_digits()
    return _split(data.data, data.target)


@pytest.fixture(scope="module")
def diabetes() -> tuple[np.ndarray, ...]:
    data = load_diabetes()
    return _split(data.data, data.target)


def _run_onnx(converted: ConvertedModel, x: np.ndarray) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(converted.onnx_bytes, providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input"]
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {"input": x}), strict=True))


def _assert_canonical(converted: ConvertedModel, n_features: int) -> None:
    proto = onnx.load_from_string(converted.onnx_bytes)
    onnx.checker.check_model(proto)
    assert not [n for n in proto.graph.node if n.op_type == "ZipMap"]
    assert [o.name for o in proto.graph.output] == converted.output_names
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert not dims[0].HasField("dim_value")  # dynamic batch axis
    assert dims[1].dim_value == n_features
    assert converted.n_features == n_features
    assert converted.input_name == "input"


def _assert_classifier_parity(model: Any, x_test: np.ndarray, converted: ConvertedModel) -> None:
    _assert_canonical(converted, x_test.shape[1])
    assert converted.task == "classification"
    assert converted.output_names == ["label", "probabilities"]
    assert converted.class_labels == [c.item() for c in _final(model).classes_]
    assert all(type(c) is int for c in converted.class_labels)
    out = _run_onnx(converted, x_test)
    proba = out["probabilities"]
    assert proba.dtype == np.float32
    assert proba.shape == (len(x_test), len(converted.class_labels))
    np.testing.assert_allclose(proba, model.predict_proba(x_test), atol=1e-4)
    np.testing.assert_array_equal(out["label"].ravel(), model.predict(x_test))
    assert 0.0 <= converted.max_abs_diff <= 1e-4


def _assert_regressor_parity(model: Any, x_test: np.ndarray, converted: ConvertedModel) -> None:
    _assert_canonical(converted, x_test.shape[1])
    assert converted.task == "regression"
    assert converted.output_names == ["variable"]
    assert converted.class_labels is None
    out = _run_onnx(converted, x_test)["variable"]
    assert out.shape[0] == len(x_test)
    np.testing.assert_allclose(out.ravel(), model.predict(x_test), rtol=1e-4, atol=1e-4)


def _final(model: Any) -> Any:
    return model.steps[-1][1] if hasattr(model, "steps") else model


# --- scikit-learn --------------------------------------------------------------------------


def test_sklearn_pipeline_scaler_logistic_regression(cancer: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = cancer
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    converted = convert(model, x[:100])
    assert converted.framework == "scikit-learn"
    assert converted.framework_version
    assert converted.handles_missing is False
    _assert_classifier_parity(model, x_test, converted)


def test_sklearn_random_forest_multiclass(digits: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = digits
    model = RandomForestClassifier(n_estimators=10, max_depth=8, random_state=0).fit(x, y)
    converted = convert(model, x[:100])
    assert converted.class_labels == list(range(10))
    _assert_classifier_parity(model, x_test, converted)


def test_sklearn_string_class_labels_are_plain_strings(cancer: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = cancer
    names = np.array(["benign", "malignant"])[y]
    model = LogisticRegression(max_iter=2000).fit(x, names)
    converted = convert(model, x[:100])
    assert converted.class_labels == ["benign", "malignant"]
    assert all(type(c) is str for c in converted.class_labels)
    out = _run_onnx(converted, x_test)
    np.testing.assert_array_equal(out["label"].ravel(), model.predict(x_test))


def test_sklearn_regressors(diabetes: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = diabetes
    for model in (
        make_pipeline(StandardScaler(), Ridge()).fit(x, y),
        RandomForestRegressor(n_estimators=10, max_depth=6, random_state=0).fit(x, y),
    ):
        converted = convert(model, x[:100])
        assert converted.framework == "scikit-learn"
        _assert_regressor_parity(model, x_test, converted)


def test_hist_gradient_boosting_declares_missing_values(cancer: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = cancer
    model = HistGradientBoostingClassifier(max_iter=10, random_state=0).fit(x, y)
    sample = x[:100].copy()
    sample[::7, 3] = np.nan  # NaN goes down the learned branch on both sides
    converted = convert(model, sample)
    assert converted.handles_missing is True
    _assert_classifier_parity(model, x_test, converted)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_sklearn_gradient_boosting_and_mlp_in_pipelines(digits: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = digits
    for model in (
        make_pipeline(
            SimpleImputer(), GradientBoostingClassifier(n_estimators=5, max_depth=2, random_state=0)
        ),
        make_pipeline(
            StandardScaler(), MLPClassifier(hidden_layer_sizes=(16,), max_iter=30, random_state=0)
        ),
    ):
        model.fit(x, y)
        _assert_classifier_parity(model, x_test, convert(model, x[:100]))


# --- LightGBM ------------------------------------------------------------------------------

LGB_PARAMS: dict[str, Any] = {"n_estimators": 15, "num_leaves": 8, "verbose": -1, "random_state": 0}


def test_lightgbm_binary_classifier(cancer: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = cancer
    model = lgb.LGBMClassifier(**LGB_PARAMS).fit(x, y)
    converted = convert(model, x[:100])
    assert converted.framework == "lightgbm"
    assert converted.framework_version == lgb.__version__
    assert converted.handles_missing is True
    _assert_classifier_parity(model, x_test, converted)


def test_lightgbm_multiclass_classifier(digits: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = digits
    model = lgb.LGBMClassifier(**{**LGB_PARAMS, "n_estimators": 5}).fit(x, y)
    converted = convert(model, x[:100])
    assert converted.class_labels == list(range(10))
    _assert_classifier_parity(model, x_test, converted)


def test_lightgbm_regressor_and_pipeline(diabetes: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = diabetes
    model = lgb.LGBMRegressor(**LGB_PARAMS).fit(x, y)
    _assert_regressor_parity(model, x_test, convert(model, x[:100]))
    pipe = make_pipeline(SimpleImputer(), lgb.LGBMRegressor(**LGB_PARAMS)).fit(x, y)
    _assert_regressor_parity(pipe, x_test, convert(pipe, x[:100]))


def test_lightgbm_raw_booster(cancer: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = cancer
    booster = lgb.train(
        {"objective": "binary", "num_leaves": 8, "verbose": -1},
        lgb.Dataset(x, y),
        num_boost_round=10,
    )
    converted = convert(booster, x[:100])
    assert converted.task == "classification"
    assert converted.class_labels == [0, 1]
    _assert_canonical(converted, x.shape[1])
    out = _run_onnx(converted, x_test)
    np.testing.assert_allclose(out["probabilities"][:, 1], booster.predict(x_test), atol=1e-4)
    expected_labels = (np.asarray(booster.predict(x_test)) > 0.5).astype(int)
    np.testing.assert_array_equal(out["label"], expected_labels)


def test_lightgbm_raw_booster_regression(diabetes: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = diabetes
    booster = lgb.train(
        {"objective": "regression", "num_leaves": 8, "verbose": -1},
        lgb.Dataset(x, y),
        num_boost_round=10,
    )
    converted = convert(booster, x[:100])
    assert converted.task == "regression" and converted.class_labels is None
    _assert_canonical(converted, x.shape[1])
    out = _run_onnx(converted, x_test)["variable"].ravel()
    np.testing.assert_allclose(out, booster.predict(x_test), rtol=1e-4)


def test_lightgbm_thresholds_round_down_to_float32() -> None:
    """``x <= t`` (double t) equals ``x <= floor32(t)`` for every float32 x; nearest would not."""
    t = 0.1  # float32(0.1) rounds *up* past 0.1
    assert float(np.float32(t)) > t
    tree: dict[str, Any] = {
        "decision_type": "<=",
        "threshold": t,
        "left_child": {"leaf_value": 1.0},
    }
    floor32_thresholds(tree)
    floor = np.float32(tree["threshold"])
    assert float(floor) <= t < float(np.nextafter(floor, np.float32(np.inf)))
    x = np.float32(t)  # the float32 nearest 0.1 is above 0.1: LightGBM sends it right
    assert not float(x) <= t and not x <= floor


# --- XGBoost -------------------------------------------------------------------------------

XGB_PARAMS: dict[str, Any] = {"n_estimators": 10, "max_depth": 3, "random_state": 0}


def test_xgboost_classifier_binary_and_multiclass(
    cancer: tuple[np.ndarray, ...], digits: tuple[np.ndarray, ...]
) -> None:
    for x, y, x_test, _ in (cancer, digits):
        model = xgb.XGBClassifier(**XGB_PARAMS).fit(x, y)
        converted = convert(model, x[:100])
        assert converted.framework == "xgboost"
        assert converted.handles_missing is True
        _assert_classifier_parity(model, x_test, converted)


def test_xgboost_regressor(diabetes: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = diabetes
    model = xgb.XGBRegressor(**XGB_PARAMS).fit(x, y)
    _assert_regressor_parity(model, x_test, convert(model, x[:100]))
    # float32 scaling can move a value across a split, so trees get an exact preprocessing step
    pipe = make_pipeline(SimpleImputer(), xgb.XGBRegressor(**XGB_PARAMS)).fit(x, y)
    _assert_regressor_parity(pipe, x_test, convert(pipe, x[:100]))


def test_xgboost_trained_on_named_columns(cancer: tuple[np.ndarray, ...]) -> None:
    """Column names in the tree dump would break onnxmltools; convert maps them to f0..fN."""
    import pandas as pd

    x, y, x_test, _ = cancer
    frame = pd.DataFrame(x, columns=[f"col_{i}" for i in range(x.shape[1])])
    model = xgb.XGBClassifier(**XGB_PARAMS).fit(frame, y)
    converted = convert(model, x[:100])
    names = model.get_booster().feature_names
    assert names is not None and names[0] == "col_0"  # the caller's model is untouched
    out = _run_onnx(converted, x_test)
    test_frame = pd.DataFrame(x_test, columns=frame.columns)
    np.testing.assert_allclose(out["probabilities"], model.predict_proba(test_frame), atol=1e-4)


# --- PyTorch -------------------------------------------------------------------------------


def _mlp(n_in: int, n_out: int, softmax: bool) -> Any:
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(n_in, 16), torch.nn.ReLU(), torch.nn.Linear(16, n_out)]
    if softmax:
        layers.append(torch.nn.Softmax(dim=1))
    return torch.nn.Sequential(*layers)


@pytest.mark.parametrize(("n_out", "softmax"), [(3, True), (1, False)])
def test_pytorch_mlp(cancer: tuple[np.ndarray, ...], n_out: int, softmax: bool) -> None:
    import torch

    x, _, x_test, _ = cancer
    x_scaled = (x - x.mean(0)) / x.std(0)
    module = _mlp(x.shape[1], n_out, softmax)
    converted = convert(module, x_scaled[:8])
    assert converted.framework == "pytorch"
    assert converted.framework_version == torch.__version__
    assert converted.output_names == ["output"]
    _assert_canonical(converted, x.shape[1])
    rows = ((x_test - x.mean(0)) / x.std(0)).astype(np.float32)  # batch size differs from sample
    out = _run_onnx(converted, rows)["output"]
    with torch.no_grad():
        expected = module(torch.from_numpy(rows)).numpy()
    assert out.shape == (len(rows), n_out)
    np.testing.assert_allclose(out, expected, atol=1e-4)


def test_pytorch_higher_rank_input_keeps_dynamic_batch() -> None:
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv1d(2, 4, kernel_size=3), torch.nn.Flatten())
    sample = np.random.default_rng(0).normal(size=(4, 2, 8)).astype(np.float32)
    converted = convert(module, sample)
    assert converted.n_features == 16
    rows = np.random.default_rng(1).normal(size=(9, 2, 8)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(rows)).numpy()
    np.testing.assert_allclose(_run_onnx(converted, rows)["output"], expected, atol=1e-5)


def test_pytorch_module_returning_a_tuple_is_refused() -> None:
    import torch

    class TwoHeads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.linear(x)
            return y, y * 2

    with pytest.raises(ConversionError, match="returns tuple"):
        convert(TwoHeads(), np.zeros((2, 3), dtype=np.float32))


def test_pytorch_module_may_declare_class_labels(cancer: tuple[np.ndarray, ...]) -> None:
    x, *_ = cancer
    module = _mlp(x.shape[1], 2, softmax=True)
    module.classes_ = np.array([0, 1])
    converted = convert(module, x[:4])
    assert converted.task == "classification"
    assert converted.class_labels == [0, 1]


def test_pytorch_missing_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins
    import importlib

    real_import = importlib.import_module

    def no_torch(name: str, *args: Any) -> Any:
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_torch)
    with pytest.raises(ConversionError, match=r"pip install 'redline\[torch\]'"):
        import_framework("torch", "torch")
    assert builtins  # the real import machinery is untouched outside this helper


# --- refusals ------------------------------------------------------------------------------


def test_float32_rounding_beyond_tolerance_is_refused(diabetes: tuple[np.ndarray, ...]) -> None:
    x, y, *_ = diabetes
    model = make_pipeline(StandardScaler(), Ridge()).fit(x, y)
    with pytest.raises(ConversionError) as info:
        convert(model, x[:50], tolerance=1e-12)
    message = str(info.value)
    err = info.value
    assert err.details["max_abs_diff"] > 0
    assert f"{err.details['max_abs_diff']:.3g}" in message
    assert f"sample row {err.details['row']}" in message
    assert "tolerance is 1e-12" in message and "--tolerance" in message
    # the same model passes at the default tolerance, and reports what it saw
    converted = convert(model, x[:50])
    assert 0 < converted.max_abs_diff < err.details["max_abs_diff"] * 10


def test_corrupted_graph_is_refused(
    cancer: tuple[np.ndarray, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A converter bug that changes the numbers is caught by the parity check."""
    x, y, *_ = cancer
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    real_rename = from_sklearn.rename_outputs

    corrupted = []

    def corrupt(onx: Any, names: list[str]) -> None:
        real_rename(onx, names)
        for node in onx.graph.node:  # shift the scaler's offsets: every row is mis-scaled
            for attr in node.attribute:
                if node.op_type == "Scaler" and attr.name == "offset":
                    attr.floats[:] = [v + 1.0 for v in attr.floats]
                    corrupted.append(node.name)

    monkeypatch.setattr(from_sklearn, "rename_outputs", corrupt)
    with pytest.raises(ConversionError, match=r"conversion refused.*'probabilities' differs"):
        convert(model, x[:100])
    assert corrupted


def test_label_mismatch_is_refused(
    cancer: tuple[np.ndarray, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    x, y, *_ = cancer
    model = LogisticRegression(max_iter=2000).fit(x, y)
    real = parity.reference_outputs

    def swapped(*args: Any) -> dict[str, Any]:
        out = real(*args)
        out["label"] = 1 - out["label"]  # the original "predicts" the other class
        return out

    monkeypatch.setattr(parity, "reference_outputs", swapped)
    with pytest.raises(ConversionError, match=r"predicts label .* at sample row 0"):
        convert(model, x[:20])


def test_unsupported_object_is_refused() -> None:
    with pytest.raises(ConversionError, match=r"cannot convert a builtins.dict.*scikit-learn"):
        convert({"weights": [1, 2]}, np.zeros((2, 2)))
    with pytest.raises(ConversionError, match="supported frameworks"):
        detect_framework(object())


def test_classifier_without_predict_proba_is_refused(cancer: tuple[np.ndarray, ...]) -> None:
    x, y, *_ = cancer
    model = SVC().fit(x[:100], y[:100])
    with pytest.raises(ConversionError, match=r"SVC has no predict_proba.*probability=True"):
        convert(model, x[:10])


def test_bad_samples_are_refused(cancer: tuple[np.ndarray, ...]) -> None:
    x, y, *_ = cancer
    model = LogisticRegression(max_iter=2000).fit(x, y)
    with pytest.raises(ConversionError, match=r"trained on 30"):
        convert(model, x[:10, :5])
    with pytest.raises(ConversionError, match=r"non-empty 2-D"):
        convert(model, x[0])
    with pytest.raises(ConversionError, match=r"non-empty 2-D"):
        convert(model, x[:0])
    with pytest.raises(ConversionError, match=r"float32 numbers"):
        convert(model, np.array([["a"] * 30], dtype=object))


def test_detect_framework_names() -> None:
    assert detect_framework(LogisticRegression()) == "scikit-learn"
    assert detect_framework(make_pipeline(StandardScaler(), Ridge())) == "scikit-learn"
    assert detect_framework(lgb.LGBMClassifier()) == "lightgbm"
    assert detect_framework(xgb.XGBRegressor()) == "xgboost"
    assert detect_framework(_mlp(3, 1, False)) == "pytorch"
    assert detect_framework(b"\x08\x07") == "onnx"


def test_onnx_model_passes_through(cancer: tuple[np.ndarray, ...]) -> None:
    x, y, x_test, _ = cancer
    model = LogisticRegression(max_iter=2000).fit(x, y)
    first = convert(model, x[:20])
    again = convert(onnx.load_from_string(first.onnx_bytes), x[:20])
    assert again.framework == "onnx"
    assert again.onnx_bytes == first.onnx_bytes
    assert again.output_names == ["label", "probabilities"]
    assert again.task == "classification"
    with pytest.raises(ConversionError, match="does not run on the sample"):
        convert(first.onnx_bytes, x[:5, :3])
