"""Serving reads the feature registry: `features apply` decides which view version is
live, an edit without `apply` changes nothing served, and a model that could only answer 409 (a
version the registry does not have) or 400 (a NaN default into a model that rejects NaN) fails
to load with its reason instead of serving."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from redline.features import load_definitions
from redline.features.versioning import ViewRegistry, live_definitions
from redline.models import ModelRepository
from tests.pipeline.conftest import HERE, make_settings

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

EDITED = '''
card_txn = FeatureView(
    "card_txn",
    transactions,
    [count("1h"), agg_sum("amount", "1h"), mean("amount", "1h", default=0.0), count("5m")],
)
'''


def _model(repo: Path, name: str, features: list[str], views: dict[str, str]) -> None:
    from sklearn.linear_model import LogisticRegression

    x = np.random.default_rng(3).random((80, len(features))).astype(np.float32)
    ModelRepository(repo).add_estimator(name, LogisticRegression().fit(x, x[:, 0] > 0.5), x,
                                        feature_names=features, feature_views=views)


@pytest.mark.allow_log(r"model new is not ready: .* cannot be served with these features")
def test_an_edit_without_apply_changes_nothing_served(serve, tmp_path) -> None:
    defs_file = tmp_path / "defs.py"
    shutil.copy(HERE / "defs_cards.py", defs_file)
    applied = load_definitions(defs_file)
    registry = ViewRegistry(tmp_path / "registry")
    registry.apply(applied)
    text = defs_file.read_text()
    start = text.index("card_txn = FeatureView(")
    end = text.index(")\n\n\n@request_transform") + 2
    defs_file.write_text(text[:start] + EDITED.strip() + "\n" + text[end:])
    edited = load_definitions(defs_file)
    v1, v2 = applied.versions()["card_txn"], edited.versions()["card_txn"]
    assert v1 != v2
    # the live definitions are the applied version, rebuilt from the registry's record
    live = live_definitions(edited, registry)
    assert live.versions() == {"card_txn": v1}
    assert "count_5m" not in live.view("card_txn").feature_names
    repo = tmp_path / "models"
    _model(repo, "old", ["card_txn:count_1h", "amount"], {"card_txn": v1})
    _model(repo, "new", ["card_txn:count_1h", "amount"], {"card_txn": v2})
    settings = make_settings(repo, defs_file)
    settings.features.registry = str(tmp_path / "registry")
    srv = serve(settings)
    body = {"entities": {"card_id": "c1"}, "request": {"amount": 3.0}}
    with httpx.Client(base_url=srv.http, timeout=10) as c:
        ok = c.post("/v1/models/old/predict", json=body)
        refused = c.post("/v1/models/new/predict", json=body)
        ready = c.get("/v2/models/new/ready")
    assert ok.status_code == 200, ok.text
    assert refused.status_code == 503 and ready.status_code != 200
    assert refused.json()["code"] == "model_not_ready"
    assert f"served at version {v1}" in refused.json()["error"] and v2 in refused.json()["error"]


@pytest.mark.allow_log(r"model strict is not ready: .* rejects NaN inputs")
def test_a_nan_default_into_a_model_that_rejects_nan_fails_to_load(serve, tmp_path) -> None:
    defs_file = tmp_path / "defs.py"
    text = (HERE / "defs_cards.py").read_text().replace(
        'mean("amount", "1h", default=0.0)', 'mean("amount", "1h")')
    defs_file.write_text(text)
    repo = tmp_path / "models"
    _model(repo, "strict", ["card_txn:amount_mean_1h", "amount"], {})
    _model(repo, "counts", ["card_txn:count_1h", "amount"], {})
    srv = serve(make_settings(repo, defs_file))
    body = {"entities": {"card_id": "never-seen"}, "request": {"amount": 3.0}}
    with httpx.Client(base_url=srv.http, timeout=10) as c:
        strict = c.post("/v1/models/strict/predict", json=body)
        counts = c.post("/v1/models/counts/predict", json=body)
    assert counts.status_code == 200
    assert strict.status_code == 503, strict.text  # never a 400 for a new entity
    err = strict.json()["error"]
    assert "'card_txn:amount_mean_1h' (mean, default NaN)" in err
    assert "finite default" in err and "--missing-values allow" in err
