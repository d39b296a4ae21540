"""Small real models on scikit-learn's bundled data: digits (an MLP and a forest) and breast
cancer (a binary scaler+MLP pipeline and a LightGBM model). Trained once per session."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from redline.cli import main


@dataclass
class Split:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray


@pytest.fixture(scope="session")
def digits() -> Split:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return Split(x[:1000], y[:1000], x[1000:], y[1000:])


@pytest.fixture(scope="session")
def cancer() -> Split:
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = x.astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return Split(x[:300], y[:300], x[300:], y[300:])


def _quiet_fit(model: Any, x: np.ndarray, y: np.ndarray) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: short training on purpose
        return model.fit(x, y)


@pytest.fixture(scope="session")
def digits_mlp(digits: Split) -> Any:
    from sklearn.neural_network import MLPClassifier

    return _quiet_fit(MLPClassifier((64,), max_iter=60, random_state=0),
                      digits.x_train, digits.y_train)


@pytest.fixture(scope="session")
def digits_forest(digits: Split) -> Any:
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(60, max_depth=10, random_state=0).fit(
        digits.x_train, digits.y_train)


@pytest.fixture(scope="session")
def cancer_mlp(cancer: Split) -> Any:
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return _quiet_fit(make_pipeline(StandardScaler(), MLPClassifier((32,), max_iter=200,
                                                                    random_state=0)),
                      cancer.x_train, cancer.y_train)


@pytest.fixture(scope="session")
def onnx_of():
    """Convert (and cache) a fitted model to ONNX through redline.models.convert."""
    from redline.models.convert import convert

    cache: dict[int, bytes] = {}

    def get(model: Any, sample: np.ndarray) -> bytes:
        if id(model) not in cache:
            cache[id(model)] = convert(model, sample[:64]).onnx_bytes
        return cache[id(model)]

    return get


@pytest.fixture()
def repo(tmp_path: Path):
    from redline.models import ModelRepository

    return ModelRepository(tmp_path / "models")


@pytest.fixture()
def digits_npz(tmp_path: Path, digits: Split) -> Path:
    path = tmp_path / "val.npz"
    np.savez(path, X=digits.x_val, y=digits.y_val)
    return path


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the real ``redline`` entry point in-process; return (exit code, stdout, stderr)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def tune_context(model: bytes, data: Split, labels: list[Any], *, tolerance: float = 0.01,
                 metric: str = "", on_train: bool = False) -> Any:
    """Techniques tune on the first half of the validation rows, or on the training rows (as
    with ``--train-data``); tests judge on the second half, which no technique sees."""
    from redline.config import RuntimeSettings
    from redline.optimize import ModelRunner, TuneContext

    half = len(data.x_val) // 2
    x, y = (data.x_train, data.y_train) if on_train else (data.x_val[:half], data.y_val[:half])
    runner = ModelRunner(model, task="classification", class_labels=labels)
    return TuneContext(x, y, "classification", labels, runner,
                       RuntimeSettings(), metric, tolerance, fast=True)


def held_out(model: bytes, data: Split, labels: list[Any]) -> dict[str, float]:
    """Metrics on the second half of the validation rows, which no technique saw."""
    from redline.optimize import ModelRunner, task_metrics

    half = len(data.x_val) // 2
    runner = ModelRunner(model, task="classification", class_labels=labels)
    return task_metrics("classification", runner.predict(data.x_val[half:]), data.y_val[half:],
                        labels)
