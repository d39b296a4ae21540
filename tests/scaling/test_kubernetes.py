"""deploy/kubernetes validated offline: built-in kinds against the Kubernetes schemas
(kubernetes-validate, strict: unknown fields fail), KEDA's CRD structurally, the wiring
between them (selectors, probes, ports, scale targets, the embedded redline.yaml), KEDA's query
against the HPA's in promtool, and each pod run as the kubelet would run it (``podrun.py``)."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from redline.config import load_settings
from redline.models import ModelRepository
from tests.conftest import RedisServer, free_port
from tests.features.conftest import KafkaBroker
from tests.scaling.podrun import DOCKERFILE, PodLayout, argv, deployment, read_image
from tests.serving.helpers import affine_model

HERE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
K8S_VERSION = "1.33.0"


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(HERE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in documents() if d["kind"] == kind]


BUILT_IN = ("v1", "apps/v1", "policy/v1", "autoscaling/v2")


@pytest.mark.parametrize("name,doc", [(n, d) for n, d in documents()
                                      if d["apiVersion"] in BUILT_IN],
                         ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_built_in_kinds_match_the_kubernetes_schema(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_catches_a_typo() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    (serve,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "redline"]
    serve["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(serve, K8S_VERSION, strict=True)


def test_every_file_is_covered() -> None:
    kinds = {d["kind"] for _, d in documents()}
    assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "ScaledObject", "StatefulSet", "ConfigMap", "Kustomization"} <= kinds
    assert all(d["apiVersion"] in BUILT_IN or d["kind"] in ("ScaledObject", "Kustomization")
               for _, d in documents())


def test_keda_scaled_object_and_kustomization_structure() -> None:
    (scaled,) = by_kind("ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount",
                         "pollingInterval", "cooldownPeriod", "triggers", "advanced",
                         "fallback", "idleReplicaCount"}
    assert spec["scaleTargetRef"]["name"] == "redline"
    assert 0 < spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert {"serverAddress", "query", "threshold"} <= set(trigger["metadata"])
    assert all(isinstance(v, str) for v in trigger["metadata"].values())  # KEDA wants strings
    assert "redline_queue_depth" in trigger["metadata"]["query"]
    (kustomization,) = by_kind("Kustomization")
    for resource in kustomization["resources"]:
        assert (HERE / resource).is_file()
    assert "keda-scaledobject.yaml" not in kustomization["resources"]  # one autoscaler at once


def test_the_pieces_fit_together(tmp_path: Path) -> None:
    deployments = {d["metadata"]["name"]: d for d in by_kind("Deployment")}
    serve = deployments["redline"]
    pod = serve["spec"]["template"]
    labels = pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # An exec sleep (``preStop.sleep`` needs Kubernetes 1.30+) that the image can run.
    pre_stop = container["lifecycle"]["preStop"]
    assert "sleep" not in pre_stop and pre_stop["exec"]["command"][0] == "sleep"
    assert int(pre_stop["exec"]["command"][1]) > 0
    assert container["resources"]["requests"]["cpu"]
    services = {s["metadata"]["name"]: s for s in by_kind("Service")}
    assert services["redline"]["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in services["redline"]["spec"]["ports"]} <= set(ports)
    (pdb,) = by_kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < serve["spec"]["replicas"]
    (hpa,) = by_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "redline"
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "redline_queue_depth"
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    # The embedded redline.yaml is a valid redline config, and its drain fits the grace period.
    (config,) = [c for c in by_kind("ConfigMap") if c["metadata"]["name"] == "redline-config"]
    path = tmp_path / "redline.yaml"
    path.write_text(config["data"]["redline.yaml"])
    settings = load_settings(path)
    assert settings.features.store == "redis"  # workers and replicas share state
    assert settings.server.http_port == ports["http"] and settings.server.grpc_port == ports["grpc"]
    assert settings.server.drain_timeout_s + int(pre_stop["exec"]["command"][1]) < grace
    assert "redline-redis" in settings.features.redis_url
    assert services["redline-redis"]["spec"]["ports"][0]["port"] == 6379
    ingest = deployments["redline-ingest"]["spec"]["template"]["spec"]["containers"][0]
    image = read_image(DOCKERFILE)
    assert argv(image, ingest)[:3] == ["redline", "ingest", "kafka"]
    assert argv(image, container)[:2] == ["redline", "serve"]
    assert settings.features.kafka_group


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: run `bash tools/services.d/40-promtool.sh`")
    return found


def test_keda_scales_like_the_hpa_it_mirrors(tmp_path: Path) -> None:
    """Three pods, two models each (so two ``redline_model_loaded`` series per pod): KEDA's
    query, which it divides by the replicas itself (AverageValue), asks for the replicas the HPA
    asks for from the adapter's per-pod sums. promtool evaluates both queries."""
    (scaled,) = by_kind("ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger.get("metricType", "AverageValue") == "AverageValue"
    threshold = float(trigger["metadata"]["threshold"])
    (hpa,) = by_kind("HorizontalPodAutoscaler")
    target = float(hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"])
    assert threshold == target
    (adapter,) = [c for c in by_kind("ConfigMap")
                  if c["metadata"]["name"] == "redline-prometheus-adapter"]
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    depths = {("redline-a", "fraud"): 9, ("redline-a", "rank"): 3, ("redline-b", "fraud"): 14,
              ("redline-b", "rank"): 2, ("redline-c", "fraud"): 7, ("redline-c", "rank"): 1}
    series = []
    for (pod, model), depth in depths.items():
        where = f'namespace="default", pod="{pod}", model="{model}"'
        series.append({"series": f"redline_queue_depth{{{where}}}", "values": f"{depth}x5"})
        series.append({"series": f"redline_model_loaded{{{where}, version=\"1\"}}",
                       "values": "1x5"})
    per_pod = {p: sum(d for (q, _), d in depths.items() if q == p) for p, _ in depths}
    hpa_query = rule["metricsQuery"].replace("<<.Series>>", "redline_queue_depth").replace(
        "<<.LabelMatchers>>", 'namespace="default"').replace("<<.GroupBy>>", "pod")
    keda_total = sum(depths.values())
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": trigger["metadata"]["query"], "eval_time": "2m",
             "exp_samples": [{"labels": "{}", "value": keda_total}]},
            {"expr": hpa_query, "eval_time": "2m",
             "exp_samples": [{"labels": f'{{pod="{p}"}}', "value": v}
                             for p, v in per_pod.items()]}]}]}
    path = tmp_path / "keda.test.yml"
    path.write_text(yaml.safe_dump(tests))
    done = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    replicas = len(per_pod)
    # The HPA: ceil(replicas * mean(per pod) / target); KEDA: ceil(query / threshold).
    hpa_wants = math.ceil(replicas * (sum(per_pod.values()) / replicas) / target)
    keda_wants = math.ceil(keda_total / threshold)
    assert keda_wants == hpa_wants == 9


def project_folder(root: Path) -> Path:
    """A project as ``redline init`` lays it out: .redline/models and features.py."""
    ModelRepository(root / ".redline" / "models").add_onnx("affine", affine_model())
    (root / "features.py").write_text(
        "from redline.features import Entity, EventSource, FeatureView, count\n"
        "user = Entity('user', join_key='user_id')\n"
        "purchases = EventSource('purchases', user, {'amount': float}, timestamp='ts')\n"
        "user_activity = FeatureView('user_activity', purchases, [count('1h')])\n")
    return root


def lay_out_pod(tmp_path: Path, name: str, redis: RedisServer, kafka: str = "") -> PodLayout:
    pod = deployment(name)["spec"]["template"]["spec"]
    layout = PodLayout(tmp_path / "pod", pod, hosts={
        "redline-redis:6379": f"127.0.0.1:{redis.port}",
        "kafka:9092": kafka or f"127.0.0.1:{free_port()}"})
    layout.fill_bundle(project_folder(tmp_path / "project"))
    layout.run_init_containers()
    return layout


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    try:
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.slow
def test_the_serving_pod_starts_and_answers(tmp_path: Path, redis_server: RedisServer) -> None:
    """The serve Deployment's pod as the kubelet runs it: the bundle copied in by the init
    container, then the image's ENTRYPOINT with the manifest's args, env and mounts; its
    readiness probe answers 200 and the bundle's model infers."""
    layout = lay_out_pod(tmp_path, "redline", redis_server)
    http_port, grpc_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    proc = layout.start("redline", {"REDLINE_SERVER__HTTP_PORT": str(http_port),
                                    "REDLINE_SERVER__GRPC_PORT": str(grpc_port)}, log)
    (container,) = deployment("redline")["spec"]["template"]["spec"]["containers"]
    probe = container["readinessProbe"]["httpGet"]["path"]
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{http_port}{probe}", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        answer = httpx.post(f"http://127.0.0.1:{http_port}/v2/models/affine/infer", json={
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                        "data": [1, 2, 3, 4]}]}, timeout=5)
        assert answer.status_code == 200, answer.text
        # Metrics merge across the pod's workers in the mounted PROMETHEUS_MULTIPROC_DIR.
        assert any(layout.path("/tmp/redline-metrics").iterdir())
    finally:
        assert stop(proc) == 0, log.read_text()[-3000:]


@pytest.mark.slow
def test_the_ingest_pod_starts_and_consumes(tmp_path: Path, redis_server: RedisServer) -> None:
    """The ingest Deployment's pod: the image's ENTRYPOINT with ``ingest kafka ...`` reaches
    its running state (definitions loaded from the bundle, Redis answered, a Kafka broker
    there), stays up, and stops cleanly on SIGTERM."""
    broker = KafkaBroker(tmp_path / "kafka")
    (tmp_path / "kafka").mkdir()
    broker.start()
    try:
        broker.create_topic("card-events", 1)
        layout = lay_out_pod(tmp_path, "redline-ingest", redis_server, broker.bootstrap)
        log = tmp_path / "ingest.log"
        proc = layout.start("ingest", {}, log)
        try:
            deadline = time.monotonic() + 90
            while "on kafka topic card-events group redline-ingest" not in log.read_text():
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            time.sleep(1.0)
            assert proc.poll() is None, log.read_text()[-3000:]
        finally:
            assert stop(proc) == 0, log.read_text()[-3000:]
    finally:
        broker.kill()
