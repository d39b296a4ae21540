"""Review: bounded rate and capacity, labels into quality, Parquet export."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq
import pytest

from redline.config import MonitoringSettings
from redline.errors import InvalidInput, NotFound
from redline.models.metadata import ModelMetadata, TensorSpec, profile_inputs
from redline.monitoring.review import ReviewQueue
from redline.monitoring.windows import ModelWindows
from tests.monitoring.helpers import record


def meta() -> ModelMetadata:
    x = np.random.default_rng(0).normal(0, 1, (5000, 2))
    return ModelMetadata("m", 1, [TensorSpec("x", "FP32", [-1, 2])],
                         [TensorSpec("label", "INT64", [-1]),
                          TensorSpec("probabilities", "FP32", [-1, 2])], "0",
                         task="classification", feature_names=["a", "b"],
                         metrics={"roc_auc": 0.9}, input_profile=profile_inputs(x, ["a", "b"]))


def test_rate_and_capacity_are_bounded() -> None:
    q = ReviewQueue(per_minute=60, capacity=5)
    queued = sum(q.offer("m", "1", f"r{i}", ["uncertain"], {"a": 1}, 0.5, 0.5)
                 for i in range(100))
    assert queued == 10  # the burst: a tenth of a minute's rate
    assert q.stats()["rate_limited"] == 90 and len(q.pending()) == 5 and q.dropped == 5


def test_edge_cases_are_sampled_and_labels_flow_into_quality_and_parquet() -> None:
    settings = MonitoringSettings(review_per_minute=600)
    review = ReviewQueue(settings.review_per_minute, settings.review_capacity)
    windows = ModelWindows(lambda m, v: meta(), settings, review)
    x_sure, x_odd = np.array([[0.1, 0.2]], np.float32), np.array([[9.0, 0.0]], np.float32)
    p_sure, p_unsure = np.array([[0.95, 0.05]]), np.array([[0.45, 0.55]])
    windows.request_finished(record(request_id="sure", inputs={"x": x_sure},
                                    outputs={"probabilities": p_sure}))
    windows.request_finished(record(request_id="unsure", inputs={"x": x_sure},
                                    outputs={"probabilities": p_unsure}))
    windows.request_finished(record(request_id="odd", inputs={"x": x_odd},
                                    outputs={"probabilities": p_sure}))
    assert windows.absorb() == 3
    items = {i["request_id"]: i for i in review.pending()}
    assert set(items) == {"unsure", "odd"}
    assert items["unsure"]["reasons"] == ["uncertain"]
    assert items["odd"]["reasons"] == ["out_of_range:a"]
    assert items["odd"]["features"] == {"a": 9, "b": 0}
    done = review.label(items["unsure"]["id"], 1, reviewer="ana")
    quality = windows.quality[("m", "1")]
    assert quality.label(done["request_id"], done["label"])
    assert quality.report()["labelled"] == 1
    with pytest.raises(NotFound):
        review.label(items["unsure"]["id"], 1)
    with pytest.raises(InvalidInput):
        review.label(items["odd"]["id"], "yes")
    table = pq.read_table(io.BytesIO(review.export_parquet())).to_pylist()
    assert table == [{"review_id": done["id"], "model": "m", "version": "1",
                      "request_id": "unsure", "reasons": "uncertain", "a": pytest.approx(0.1),
                      "b": pytest.approx(0.2), "score": 0.55, "label": 1.0, "reviewer": "ana",
                      "labelled_at": done["labelled_at"]}]


def test_a_reviewer_s_label_counts_once_and_in_the_labels_metric(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Over HTTP: a reviewer's label on a request labelled already is a duplicate (the
    labelled count stays); one on a request with no label joins; both are in
    ``redline_labels_total``, as a second POSTed label is."""
    import time

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from tests.monitoring.served import ADMIN_TOKEN, start, training_data, v2_body

    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    server = start(tmp_path / "repo")

    def labels_total() -> dict[str, float]:
        text = httpx.get(server.http + "/metrics").text
        return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name == "redline_labels_total"}

    try:
        with httpx.Client(base_url=server.http, timeout=30,
                          headers={"x-redline-budget-ms": "5000"}) as http:
            x = training_data(np.random.default_rng(1), 2)
            x[:, 1] += 60  # far older than any training row: out of range, queued for review
            for i in range(2):
                assert http.post("/v2/models/fraud/infer",
                                 json=v2_body(x[i:i + 1], f"odd{i}")).status_code == 200
            deadline = time.monotonic() + 30
            items: dict[str, dict] = {}
            while set(items) != {"odd0", "odd1"}:
                assert time.monotonic() < deadline, items
                items = {i["request_id"]: i
                         for i in http.get("/v1/review", headers=auth).json()["items"]}
                time.sleep(0.1)
            first = http.post("/v1/labels", json={"labels": [{"request_id": "odd0", "label": 1}]})
            assert first.json()["joined"] == 1

            def labelled() -> int:
                doc = http.get("/v1/models/fraud/quality").json()
                return int(doc["versions"][0]["labelled"])

            assert labelled() == 1 and labels_total() == {"joined": 1.0}
            # the reviewer labels the request that has its label: counted once, as a duplicate
            assert http.post(f"/v1/review/{items['odd0']['id']}/label", headers=auth,
                             json={"label": 0}).status_code == 200
            assert labelled() == 1
            assert labels_total() == {"joined": 1.0, "duplicate": 1.0}
            # the reviewer labels one with no label yet: it joins, and is counted
            assert http.post(f"/v1/review/{items['odd1']['id']}/label", headers=auth,
                             json={"label": 1}).status_code == 200
            assert labelled() == 2
            assert labels_total() == {"joined": 2.0, "duplicate": 1.0}
            # a second POSTed label of either is a duplicate too, not unmatched
            again = http.post("/v1/labels", json={"labels": [
                {"request_id": "odd0", "label": 1}, {"request_id": "odd1", "label": 1}]}).json()
            assert (again["joined"], again["duplicate"], again["unmatched"]) == (0, 2, 0)
            assert labelled() == 2
            assert labels_total() == {"joined": 2.0, "duplicate": 3.0}
    finally:
        server.stop()
