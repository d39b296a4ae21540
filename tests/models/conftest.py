"""Small real models for the model-layer tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def breast_cancer() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    return x.astype(np.float32), y


@pytest.fixture(scope="session")
def classifier_onnx(breast_cancer: tuple[np.ndarray, np.ndarray]) -> bytes:
    """A scaled logistic regression on breast cancer, as plain ONNX (no ZipMap)."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = breast_cancer
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    onx = to_onnx(model, x[:1], options={"zipmap": False})
    return onx.SerializeToString()


@pytest.fixture()
def repo(tmp_path):
    from redline.models import ModelRepository

    return ModelRepository(tmp_path / "models")
