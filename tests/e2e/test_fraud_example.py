"""The fraud example end to end at a small size: generate, train point-in-time, serve, replay."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from redline.models import ModelRepository
from redline.models.metadata import validation_figures
from tests.conftest import SmallDemo
from tests.pipeline.conftest import serve  # noqa: F401,F811 - the server fixture

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fraud"


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLE))
    import features
    import generate
    import replay
    import train

    yield features, generate, train, replay
    sys.path.remove(str(EXAMPLE))


def test_fraud_example_end_to_end(example, tmp_path, serve):  # noqa: F811
    features, generate, train, replay = example
    data = generate.generate(cards=300, days=5, seed=3, card_testing_attacks=2)
    assert any(t["kind"] == "card_testing" for t in data.transactions)
    assert any(t["kind"] == "test_charge" for t in data.transactions)
    assert all(a["ts"] <= b["ts"] for a, b in zip(data.transactions[:-1], data.transactions[1:],
                                                  strict=True))
    assert all(r["ts"] < data.end_ms for r in data.labels)  # only labels known by the end
    result = train.train(data, tmp_path / "models", holdout_days=1.5, trees=40)
    assert result["holdout_fraud"] > 0
    assert result["roc_auc"] > 0.8  # the patterns are learnable from point-in-time features
    table = result["table"]
    # Point in time: a transaction's own event is not in its features. For every card whose very
    # first transaction is in the table (rows are as of 1 ms before each transaction), nothing
    # of that card can have been seen yet. (The builder's row order is not the event order.)
    first_ts: dict[str, int] = {}
    for t in data.transactions:
        first_ts.setdefault(t["card_id"], t["ts"])
    earliest = table.sort_values("ts").groupby("card_id").head(1)
    fresh = earliest[[ts + 1 == first_ts[c] for c, ts in zip(earliest["card_id"], earliest["ts"],
                                                             strict=True)]]
    assert len(fresh) > 10
    assert (fresh["card_activity:count_1m"] == 0).all()
    assert (fresh["card_activity:count_1d"] == 0).all()

    from redline.models import ModelRepository
    from tests.pipeline.conftest import make_settings

    meta = ModelRepository(tmp_path / "models").metadata("fraud", 1)
    assert set(meta.feature_views) == {"card_activity", "merchant_activity", "merchant_risk"}
    srv = serve(make_settings(tmp_path / "models", EXAMPLE / "features.py"))
    recent = data.transactions[-150:]
    cut = recent[0]["ts"]
    history = [e for t in data.transactions if t["ts"] < cut for e in features.events_of(t)]
    history += [features.label_event(r) for r in data.labels if r["ts"] < cut]
    history.sort(key=lambda e: e["ts"])
    res = srv.server.pipeline.ingestor.ingest(history, [e["ts"] for e in history])
    assert res.accepted == len(history)
    records = replay.replay(srv.http, recent)
    assert len(records) == 150
    assert all(r["path"] == "primary" and not r["degraded"] for r in records)
    assert all(0.0 <= r["score"] <= 1.0 for r in records)
    # A card's second replayed transaction sees the first one (ingested after scoring it).
    card = recent[0]["card_id"]
    with httpx.Client(base_url=srv.http, timeout=10) as c:
        doc = c.post("/v1/models/fraud/predict", json=features.request_of(
            {**recent[0], "ts": recent[0]["ts"]})).json()
    assert doc["entity_missing"] is False and card
    scores = np.array([r["score"] for r in records])
    assert np.isfinite(scores).all()
    # Live quality compares against the holdout AUC train.py recorded (as roc_auc_holdout):
    # labels that have nothing to do with the scores make the row alarm.
    labels = [{"request_id": r["txn_id"], "label": i % 2} for i, r in enumerate(records)]
    with httpx.Client(base_url=srv.http, timeout=10) as c:
        assert c.post("/v1/labels", json={"labels": labels}).status_code == 200
        quality = c.get("/v1/models/fraud/quality").json()["versions"][0]
    assert quality["reference"]["roc_auc"] == pytest.approx(result["roc_auc"])
    assert quality["labelled"] == 150 and quality["alarm"] and "roc_auc" in quality["alarms"]


def test_make_demo_step_two_at_a_small_size(small_demo: SmallDemo) -> None:
    """`make demo` step 2 end to end: train, serve, backfill, replay, measure with redline bench
    (the session's small demo, read for what it printed)."""
    text = " ".join(small_demo.output.split())
    found = re.search(r"fraud model: ROC AUC ([\d.]+) on the held-out period; /v1 predict p50 "
                      r"([\d.]+) ms, p99 ([\d.]+) ms at 1 client, (\d+) req/s at 8 clients", text)
    assert found, small_demo.output[-3000:]
    auc, p50, p99, rps_8 = (float(v) for v in found.groups())
    assert 0.5 < auc <= 1.0
    assert p50 > 0 and p99 >= p50
    assert rps_8 > 0
    repo = ModelRepository(small_demo.project / ".redline" / "models")
    assert "fraud" in repo.list_models()
    # the demo's model has the validation figure its live-quality row is compared against
    meta = repo.metadata("fraud")
    figures, _ = validation_figures(meta.metrics, meta.task)
    assert figures["roc_auc"] == pytest.approx(auc, abs=6e-4)
