"""Monitoring on a real server: /metrics after known traffic over both transports, traceparent
into spans over HTTP and gRPC, drift / labels / quality / review over HTTP, `redline top` and
`redline drift` against it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from redline.config import ModelSettings
from redline.monitoring.tracing import OtlpHttpSink
from redline.proto import grpc_service_pb2 as pb
from redline.proto import grpc_service_pb2_grpc as pbg
from tests.monitoring.otlp import OtlpReceiver
from tests.monitoring.served import (
    ADMIN_TOKEN,
    make_repository,
    monitored_settings,
    probability,
    training_data,
    v2_body,
)
from tests.serving.helpers import ServerThread

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, object]]:
    settings = monitored_settings()
    settings.monitoring.trace_sample_ratio = 0.0  # only sampled traceparents, failures, slow
    settings.models["fraud"] = ModelSettings(slo_ms=7.0)
    server = ServerThread(settings, make_repository(tmp_path_factory.mktemp("repo")))
    receiver = OtlpReceiver()  # a real OTLP/HTTP collector stand-in
    server.server.monitor.use_trace_exporter(OtlpHttpSink(receiver.endpoint))
    server.start()
    yield server, receiver
    server.stop()
    receiver.close()


def grpc_request(x: np.ndarray, rid: str = "") -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="fraud", id=rid)
    req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.astype(np.float32).tobytes())
    return req


def metric_samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_after_known_traffic_on_both_transports(served) -> None:  # type: ignore[no-untyped-def]
    server, _ = served
    rng = np.random.default_rng(1)
    # the 7 ms objective is the default budget: a generous one keeps a busy machine's hiccup
    # from turning a request into a 504
    budget = {"x-redline-budget-ms": "5000"}
    with httpx.Client(base_url=server.http, headers=budget) as http, \
            grpc.insecure_channel(server.grpc) as ch:
        before = metric_samples(http.get("/metrics").text)
        for i in range(20):
            r = http.post("/v2/models/fraud/infer", json=v2_body(training_data(rng, 1), f"m{i}"))
            assert r.status_code == 200
        stub = pbg.GRPCInferenceServiceStub(ch)
        for _ in range(10):
            stub.ModelInfer(grpc_request(training_data(rng, 2)), timeout=10)
        bad = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        for _ in range(3):
            assert http.post("/v2/models/fraud/infer", json=bad).status_code == 400
        text = http.get("/metrics").text
    got = metric_samples(text)

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return got.get(key, 0.0) - before.get(key, 0.0)

    base = {"api": "v2", "model": "fraud", "version": "1"}
    assert delta("redline_requests_total", **base, transport="rest", path="primary",
                 status="ok") == 20
    assert delta("redline_requests_total", **base, transport="grpc", path="primary",
                 status="ok") == 10
    assert delta("redline_requests_total", **base, transport="rest", path="primary",
                 status="invalid_input") == 3
    assert delta("redline_request_duration_seconds_count", **base) == 33
    assert delta("redline_stage_duration_seconds_count", **base, stage="inference") == 30
    assert delta("redline_stage_duration_seconds_bucket", **base, stage="decode",
                 le="+Inf") >= 30
    # the model's 7 ms objective is a bucket boundary, and its own gauge
    assert ("redline_request_duration_seconds_bucket",
            frozenset({**base, "le": "0.007"}.items())) in got
    assert got[("redline_latency_objective_seconds", frozenset({"model": "fraud"}.items()))
               ] == 0.007
    assert ("redline_requests_over_objective_total", frozenset(base.items())) in got
    assert got[("redline_model_loaded", frozenset({"model": "fraud", "version": "1"}.items()))
               ] == 1
    mv = frozenset({"model": "fraud", "version": "1"}.items())
    assert got[("redline_batch_rows_total", mv)] >= 40 and ("redline_queue_depth", mv) in got
    for name in ("redline_shed_total", "redline_expired_total"):
        assert any(k[0] == name for k in got), name
    # rows per request: 20 + 3 (refused, decoded as one row) of 1 row, 10 of 2 rows
    assert delta("redline_request_rows_bucket", **base, le="1.0") == 23
    assert delta("redline_request_rows_bucket", **base, le="2.0") == 33


def test_traceparent_over_http_and_grpc_becomes_the_parent_of_stage_spans(served) -> None:  # type: ignore[no-untyped-def]
    server, receiver = served
    x = training_data(np.random.default_rng(2), 1)
    header = f"00-{TRACE}-{PARENT}-01"
    with httpx.Client(base_url=server.http, headers={"x-redline-budget-ms": "5000"}) as http:
        assert http.post("/v2/models/fraud/infer", json=v2_body(x, "traced-rest"),
                         headers={"traceparent": header}).status_code == 200
        http.post("/v2/models/fraud/infer", json=v2_body(x, "unsampled"))
    with grpc.insecure_channel(server.grpc) as ch:
        pbg.GRPCInferenceServiceStub(ch).ModelInfer(grpc_request(x, "traced-grpc"), timeout=10,
                                                    metadata=(("traceparent", header),))
    tracing = server.server.monitor.tracing
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tracing.flush()
        roots = {s.attributes.get("redline.request_id"): s for s in receiver.spans
                 if s.name.startswith("redline ")}
        if {"traced-rest", "traced-grpc"} <= set(roots):
            break
        time.sleep(0.05)
    assert "unsampled" not in roots
    spans = receiver.spans
    for rid, transport in (("traced-rest", "rest"), ("traced-grpc", "grpc")):
        root = roots[rid]
        assert root.trace_id == TRACE and root.parent == PARENT
        assert root.attributes["redline.transport"] == transport
        children = {s.name for s in spans if s.parent == root.span_id}
        assert {"decode", "inference", "encode"} <= children, children


def _traceparent(value: str) -> tuple[str, str, str]:
    version, trace, span, flags = value.split("-")
    assert version == "00" and len(trace) == 32 and len(span) == 16 and span != "0" * 16
    return trace, span, flags


def test_the_response_names_the_requests_trace_over_http_and_grpc(served) -> None:  # type: ignore[no-untyped-def]
    """With tracing on an answer carries a traceparent when its caller sent one or its spans
    are kept: the caller's trace (or a new one), the server span's id, and 01 when the spans
    are kept (exported to the OTLP receiver with exactly those ids), 00 when sampling left
    them out; an unsampled answer to a caller without one carries none."""
    from redline.proto import redline_v1_pb2 as v1
    from redline.proto import redline_v1_pb2_grpc as v1g

    server, receiver = served
    x = training_data(np.random.default_rng(5), 1)
    sent = f"00-{TRACE}-{PARENT}-01"
    row = {"amount": float(x[0, 0]), "age": float(x[0, 1]), "channel": int(x[0, 2])}
    named: dict[str, tuple[str, str, str]] = {}
    with httpx.Client(base_url=server.http, headers={"x-redline-budget-ms": "5000"}) as http:
        r = http.post("/v2/models/fraud/infer", json=v2_body(x, "tp-v2-rest"),
                      headers={"traceparent": sent})
        assert r.status_code == 200
        named["tp-v2-rest"] = _traceparent(r.headers["traceparent"])
        r = http.post("/v1/models/fraud/predict", json={"request": row, "request_id": "tp-v1-rest"},
                      headers={"traceparent": sent})
        assert r.status_code == 200, r.text
        named["tp-v1-rest"] = _traceparent(r.headers["traceparent"])
        # no traceparent and 0% head sampling: not kept, so no trace is named
        r = http.post("/v2/models/fraud/infer", json=v2_body(x, "tp-new"))
        assert r.status_code == 200 and "traceparent" not in r.headers
        # a failure is always kept (tail rule), and its answer names it too
        r = http.post("/v2/models/fraud/infer", json={"inputs": [{"name": "x"}]})
        assert r.status_code == 400 and _traceparent(r.headers["traceparent"])[2] == "01"
        r = http.post("/v1/models/fraud/predict", json={"request": {"amount": 1.0}})
        assert r.status_code == 400 and _traceparent(r.headers["traceparent"])[2] == "01"
    with grpc.insecure_channel(server.grpc) as ch:
        _, call = pbg.GRPCInferenceServiceStub(ch).ModelInfer.with_call(
            grpc_request(x, "tp-v2-grpc"), timeout=10, metadata=(("traceparent", sent),))
        named["tp-v2-grpc"] = _traceparent(dict(call.trailing_metadata())["traceparent"])
        _, call = v1g.PredictionServiceStub(ch).Predict.with_call(v1.PredictRequest(
            model_name="fraud", request_id="tp-v1-grpc",
            instances=[v1.Instance(request=row)]), timeout=10,
            metadata=(("traceparent", sent),))
        named["tp-v1-grpc"] = _traceparent(dict(call.trailing_metadata())["traceparent"])
        with pytest.raises(grpc.RpcError) as err:
            pbg.GRPCInferenceServiceStub(ch).ModelInfer(pb.ModelInferRequest(model_name="nope"),
                                                        timeout=10)
        assert _traceparent(dict(err.value.trailing_metadata())["traceparent"])[2] == "01"
    for trace, _, flags in named.values():
        assert trace == TRACE and flags == "01"  # the caller's trace, sampled by the caller
    tracing = server.server.monitor.tracing
    deadline = time.monotonic() + 10
    roots: dict[str, object] = {}
    while time.monotonic() < deadline and not set(named) <= set(roots):
        tracing.flush()
        roots = {s.attributes.get("redline.request_id"): s for s in receiver.spans
                 if s.name.startswith("redline ")}
        time.sleep(0.05)
    assert "tp-new" not in roots
    for rid, (trace, span, _) in named.items():
        root = roots[rid]
        assert root.trace_id == trace  # type: ignore[attr-defined]
        assert root.span_id == span, rid  # type: ignore[attr-defined]
        assert root.parent == PARENT  # type: ignore[attr-defined]


def test_drift_labels_quality_and_review_over_http(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, _ = served
    rng = np.random.default_rng(3)
    monitor = server.server.monitor
    with httpx.Client(base_url=server.http, timeout=30,
                      headers={"x-redline-budget-ms": "5000"}) as http:
        x = training_data(rng, 400)
        ids = [f"q{i}" for i in range(0, 400, 40)]
        for i in range(0, 400, 40):
            assert http.post("/v2/models/fraud/infer",
                             json=v2_body(x[i:i + 40], f"q{i}")).status_code == 200
        calm = http.get("/v1/models/fraud/drift").json()["versions"][0]
        assert calm["window"]["rows"] >= 400 and not calm["drift"], calm["drifted"]
        # labels for the batches (one score per request id: the batch's first row)
        y = (rng.random(400) < probability(x)).astype(int)
        r = http.post("/v1/labels", json={"labels": [
            {"request_id": f"q{i}:{j}", "label": int(y[i + j])} for i in range(0, 400, 40)
            for j in range(40)] + [{"request_id": "never-seen", "label": 1}]})
        assert r.json()["joined"] == 400 and r.json()["unmatched"] == 1, (r.json(), ids)
        quality = http.get("/v1/models/fraud/quality").json()["versions"][0]
        assert quality["labelled"] == 400 and quality["realised"]["roc_auc"] > 0.6
        assert quality["estimated"]["roc_auc"] == pytest.approx(
            quality["realised"]["roc_auc"], abs=0.1)
        shifted = training_data(rng, 600)
        shifted[:, 1] += 15  # age: 1.5 standard deviations older
        for i in range(0, 600, 60):
            http.post("/v2/models/fraud/infer", json=v2_body(shifted[i:i + 60]))
        report = http.get("/v1/models/fraud/versions/1/drift").json()["versions"][0]
        assert "age" in report["drifted"] and "amount" not in report["drifted"]
        assert report["features"][1]["out_of_range_rate"] > 0
        assert http.get("/v1/review").status_code == 401
        # review: out-of-range rows were sampled; label one and export
        queue = http.get("/v1/review", headers=AUTH).json()
        # The queue's first item may be a calm row labelled above (uncertain): its review label
        # is then a duplicate and not counted again; any other request's label counts once.
        assert queue["items"], queue
        item = queue["items"][0]
        labelled = {f"q{i}:{j}" for i in range(0, 400, 40) for j in range(40)}
        counted = 400 if item["request_id"] in labelled else 401
        assert any(r.startswith(("out_of_range", "uncertain", "drift")) for r in item["reasons"])
        done = http.post(f"/v1/review/{item['id']}/label", headers=AUTH,
                         json={"label": 1, "reviewer": "test"}).json()
        assert done["label"] == 1.0
        table = pq.read_table(io.BytesIO(http.get("/v1/review/export", headers=AUTH).content))
        assert table.num_rows == 1 and {"amount", "age", "channel", "label"} <= set(
            table.column_names)
        bad = http.post("/v1/labels", json={"labels": "nope"})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_input"
        assert http.get("/v1/models/nope/drift").status_code == 404
    assert monitor.windows.quality[("fraud", "1")].report()["labelled"] == counted


def test_slow_log_and_cli_top_and_drift(served) -> None:  # type: ignore[no-untyped-def]
    server, _ = served
    with httpx.Client(base_url=server.http, headers={"x-redline-budget-ms": "5000"}) as http:
        for i in range(30):
            http.post("/v2/models/fraud/infer",
                      json=v2_body(training_data(np.random.default_rng(i), 1), f"s{i}"))
        assert http.get("/v1/debug/slow").status_code == 401
        slow = http.get("/v1/debug/slow", headers=AUTH).json()["requests"]
        assert slow and slow[0]["total_us"] >= slow[-1]["total_us"]
        # The server is shared by the module: an earlier test's refused request (no stage run)
        # can be among the slowest of the minute. Every answered inference carries its stages.
        answered = [r for r in slow if r["api"] == "v2" and r["status"] == "ok"
                    and r["model"] == "fraud"]
        assert answered and all("inference" in r["stages_us"] for r in answered), slow
    time.sleep(0.3)  # one tick
    env = {**os.environ, "PYTHONPATH": "src", "COLUMNS": "200"}
    cli = [sys.executable, "-m", "redline.cli"]
    top = subprocess.run([*cli, "top", "--once", "--url", server.http, "--admin-token",
                          ADMIN_TOKEN], env=env, capture_output=True, text=True, timeout=60)
    assert top.returncode == 0, top.stderr
    assert "slowest requests" in top.stdout and "inference" in top.stdout
    drift = subprocess.run([*cli, "drift", "-m", "fraud", "--url", server.http], env=env,
                           capture_output=True, text=True, timeout=60)
    assert drift.returncode == 0, drift.stderr
    assert "fraud v1" in drift.stdout and "age" in drift.stdout
    gone = subprocess.run([*cli, "top", "--once", "--url", "http://127.0.0.1:9"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 2 and gone.stderr.startswith("error [unreachable]")


def test_grafana_and_alert_rules_use_only_metrics_the_server_exposes(served) -> None:  # type: ignore[no-untyped-def]
    import json
    import re

    server, _ = served
    root = Path(__file__).resolve().parents[2] / "deploy"
    with httpx.Client(base_url=server.http) as http:
        text = http.get("/metrics").text
    exposed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(s.name for s in family.samples)
    names |= {n + suffix for n in exposed for suffix in ("", "_total", "_bucket", "_count",
                                                         "_sum")}
    dashboard = json.loads((root / "grafana" / "redline.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["query"]["query"])
    rules = (root / "prometheus" / "redline-rules.yml").read_text()
    used = set(re.findall(r"\bredline_[a-z_]+", "\n".join(exprs) + rules))
    missing = sorted(u for u in used if u not in names)
    assert not missing, f"queries use metrics the server does not expose: {missing}"
    recorded = set(re.findall(r"record: (redline:[a-z_:0-9]+)", rules))
    assert set(re.findall(r"redline:[a-z_]+:ratio_rate1h", "\n".join(exprs))) <= recorded
    assert len(used) >= 15
