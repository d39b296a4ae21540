"""deploy/kubernetes validated offline: built-in kinds against the Kubernetes schemas
(kubernetes-validate, strict: unknown fields fail), KEDA's CRD structurally, and the wiring
between them (selectors, probes, ports, scale targets, the embedded redline.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.config import load_settings

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
    assert container["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
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
    assert settings.server.drain_timeout_s + 5 < grace
    assert "redline-redis" in settings.features.redis_url
    assert services["redline-redis"]["spec"]["ports"][0]["port"] == 6379
    ingest = deployments["redline-ingest"]["spec"]["template"]["spec"]["containers"][0]
    assert ingest["args"][:2] == ["ingest", "kafka"]
    assert settings.features.kafka_group
