"""Definitions, semantic versions, the registry (plan/apply) and model/view version pinning."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from redline.errors import ConfigError, FeatureNotFound, VersionMismatch
from redline.features import (
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    MemoryStore,
    agg_sum,
    check_model_views,
    count,
    load_definitions,
)
from redline.features.ingest import Ingestor
from redline.features.offline import build_training_set
from redline.features.versioning import ViewRegistry
from tests.features.streams import definitions

DEFS = Path(__file__).with_name("defs_tx.py")


def _view(**changes):
    card = Entity("card", "card_id")
    src = EventSource("tx", card, {"card_id": str, "amount": float},
                      allowed_lateness=changes.pop("lateness", "5m"))
    feats = changes.pop("features", [count("1h"), agg_sum("amount", "1h")])
    return FeatureView("v", src, feats, **changes)


def test_version_follows_semantics_only() -> None:
    base = _view().version
    assert _view(description="docs only").version == base
    assert _view(features=[count("1h"), agg_sum("amount", "2h")]).version != base
    assert _view(lateness="10m").version != base
    assert _view(features=[count("1h"), agg_sum("amount", "1h", tile="10m")]).version != base
    assert len(base) == 12


def test_invalid_definitions_have_clear_errors() -> None:
    card = Entity("card", "card_id")
    src = EventSource("tx", card, {"card_id": str, "amount": float, "m": str})
    cases = [
        ([agg_sum("amnt", "1h")], "field 'amnt' is not in source 'tx' schema"),
        ([agg_sum("m", "1h")], "'sum' needs a numeric field, 'm' is str"),
        ([count("1h"), count("1h")], "duplicate feature name"),
        ([agg_sum("amount", "1h", tile="7m")], "must be a positive multiple of its tile"),
    ]
    for feats, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            FeatureView("v", src, feats).layout()
    with pytest.raises(ValueError, match="not a duration"):
        _ = count("an hour").window_ms
    with pytest.raises(ConfigError, match="view name 'a:b' must be letters"):
        FeatureView("a:b", src, [count("1h")]).layout()
    with pytest.raises(ConfigError, match="int, float, str or bool"):
        FeatureView("v", EventSource("s", card, {"x": list}), [count("1h")]).semantics()


def test_load_from_file_and_errors(tmp_path: Path) -> None:
    defs = load_definitions(DEFS)
    assert sorted(defs.views) == ["card_stats"]
    info = {r["ref"]: r for r in defs.feature_info()}
    assert info["card_stats:amount_mean_1h"]["default"] != info["card_stats:amount_mean_1h"]["default"]  # noqa: E501  NaN
    assert info["card_stats:count_1h"]["default"] == 0.0
    assert info["card_stats:count_1h"]["dtype"] == "float32"
    with pytest.raises(ConfigError, match="does not exist"):
        load_definitions(tmp_path / "missing.py")
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="RuntimeError: boom"):
        load_definitions(bad)
    with pytest.raises(FeatureNotFound, match="unknown feature view 'nope'"):
        defs.view("nope")
    with pytest.raises(FeatureNotFound, match="has no feature 'x'"):
        defs.resolve("card_stats:x")


def test_plan_apply_switch(tmp_path: Path) -> None:
    reg = ViewRegistry(tmp_path / "registry")
    v1 = FeatureDefinitions.of([_view()])
    assert [(e.action, e.view) for e in reg.plan(v1)] == [("create", "v")]
    reg.apply(v1)
    assert reg.live() == {"v": v1.views["v"].version}
    assert [e.action for e in reg.plan(v1)] == ["unchanged"]
    v2 = FeatureDefinitions.of([_view(features=[count("1h"), agg_sum("amount", "2h")])])
    (entry,) = reg.plan(v2)
    assert entry.action == "new-version"
    assert entry.changes == ["+ feature amount_sum_2h", "- feature amount_sum_1h"]
    reg.apply(v2)  # registered, but the old version keeps serving
    assert reg.live() == {"v": v1.views["v"].version}
    assert [e.action for e in reg.plan(v2)] == ["switch"]
    reg.apply(v2, switch=True)
    assert reg.live() == {"v": v2.views["v"].version}
    assert reg.versions("v") == [v1.views["v"].version, v2.views["v"].version]
    # a changed version has its own keyspace: the old one keeps its values
    assert v1.views["v"].version != v2.views["v"].version


def test_model_refuses_other_view_versions() -> None:
    check_model_views("fraud", {"v": "abc"}, {"v": "abc", "w": "def"})
    with pytest.raises(VersionMismatch, match="served at version def, the model was trained on "
                                              "abc") as err:
        check_model_views("fraud", {"v": "abc"}, {"v": "def"})
    assert err.value.http_status == 409
    with pytest.raises(VersionMismatch, match="'w' .* is not served"):
        check_model_views("fraud", {"w": "x"}, {})


def test_request_transform_is_identical_online_and_offline() -> None:
    defs = definitions()
    tr = defs.transforms["amount_ratio"]
    store = MemoryStore()
    t0 = 1_767_225_600_000
    events = [{"card_id": "c1", "amount": a, "merchant": "m", "n": 1, "ts": t0 + i}
              for i, a in enumerate([10.0, 20.0, 60.0])]
    Ingestor(defs, store).ingest(events, t0 + 5)
    reader = store.reader([defs.view("card_tx")], list(tr.features))
    feats, _ = reader.read(["c1", "c2"], t0 + 5, dtype=np.float64)
    request_amount = np.array([45.0, 3.0])
    online = tr.compute([request_amount, feats[:, 0]])
    labels = pd.DataFrame({"card_id": ["c1", "c2"], "ts": [t0 + 5, t0 + 5],
                           "amount": request_amount})
    offline = build_training_set(defs, pd.DataFrame(events), labels, ["amount_ratio"])
    assert online[0] == 45.0 / 30.0
    assert online[1] == 0.0  # no history: mean is NaN, the transform's default applies
    assert offline["amount_ratio"].tolist() == online.tolist()
    assert not math.isnan(offline["amount_ratio"][1])
