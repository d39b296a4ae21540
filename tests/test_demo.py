"""`make demo` runs end to end (small call counts to keep the suite fast)."""

from __future__ import annotations

import pytest

from redline.demo import engine_step
from redline.models import ModelRepository

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def test_engine_step_registers_and_measures(tmp_path):
    result = engine_step(tmp_path / "models", calls=300)
    repo = ModelRepository(tmp_path / "models")
    assert repo.list_models() == ["breast_cancer"]
    assert repo.aliases("breast_cancer") == {"production": 1}
    meta = repo.metadata("breast_cancer")
    assert meta.metrics["roc_auc"] > 0.95 and meta.feature_names and len(meta.feature_names) == 30
    assert result["redline_p50_us"] > 0 and result["sklearn_p50_us"] > 0
