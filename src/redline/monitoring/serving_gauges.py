"""The gauges and counters that live in the serving objects, read once a tick: queues, batch
sizes, shedding, loaded versions, rollbacks, the pipeline's breaker, caches and entities.

Kept apart from the request metrics (``metrics.py``), which requests feed: these are read from
the registry, the handles and the pipeline, each a tick (and before a scrape). What is read of
each is said by the Protocols below; serving's ``ModelRegistry``, ``ModelHandle`` and
``PredictPipeline`` satisfy them as they are (monitoring does not import serving).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from redline.monitoring.prometheus import BREAKER_LEVEL, PrometheusExport


class QueueDepth(Protocol):
    """A version's queue as the gauges read it (serving's ``Batcher``)."""

    @property
    def queued(self) -> int: ...

    @property
    def cap(self) -> int: ...


class AdmissionCounts(Protocol):
    """A version's running counts of batches, rows and shed requests (``AdmissionStats``)."""

    def as_dict(self) -> Mapping[str, int]: ...


class ServedVersion(Protocol):
    """A loaded version as the gauges read it (serving's ``ModelHandle``)."""

    @property
    def version_str(self) -> str: ...

    @property
    def batcher(self) -> QueueDepth: ...

    @property
    def stats(self) -> AdmissionCounts: ...


class LoadedModels(Protocol):
    """The models served and their loaded versions (serving's ``ModelRegistry``)."""

    def models(self) -> list[str]: ...

    def loaded(self, name: str) -> Sequence[ServedVersion]: ...


class PipelineCounters(Protocol):
    """The ``/v1`` pipeline's breaker, caches and entity counts (``PredictPipeline``)."""

    def stats(self) -> Mapping[str, Any]: ...


class ServingGauges:
    """Reads the serving objects into ``export``; with a tick's ``point``, also records that
    tick's batch sizes and shedding (the counters' change since the last tick)."""

    def __init__(self, export: PrometheusExport, settings: Any, registry: LoadedModels,
                 pipeline: PipelineCounters | None = None) -> None:
        self.export = export
        self.settings = settings
        self.registry = registry
        self.pipeline = pipeline
        self._last_stats: dict[tuple[str, str], dict[str, int]] = {}

    def sample(self, point: dict[str, Any] | None, rollouts: Any = None) -> None:
        """Gauges and counters that live in the serving objects: queues, batches, shedding.

        With a ``point`` (the tick) it also records this tick's batch sizes and shedding."""
        export = self.export
        models: dict[str, Any] = {}
        try:
            names = self.registry.models()
        except Exception:  # noqa: BLE001
            names = []
        for name in names:
            slo = float(self.settings.for_model(name).slo_ms
                        or self.settings.server.default_slo_ms)
            export.objective.labels(name).set(slo / 1000.0)
            versions = []
            for handle in loaded_versions(self.registry, name):
                v = handle.version_str
                versions.append(v)
                queued = handle.batcher.queued
                export.queue.labels(name, v).set(queued)
                export.batch_cap.labels(name, v).set(float(handle.batcher.cap))
                export.model_info.labels(name, v).set(1)
                stats = dict(handle.stats.as_dict())
                last = self._last_stats.get((name, v), {})
                if point is not None:
                    self._last_stats[(name, v)] = stats
                kv = (name, v)
                export.count_to(export.batches, ("b", *kv), stats.get("batches", 0), *kv)
                export.count_to(export.batch_rows, ("r", *kv), stats.get("rows", 0), *kv)
                export.count_to(export.shed, ("sq", *kv), stats.get("shed_queue_full", 0), *kv,
                                "queue_full")
                export.count_to(export.shed, ("sb", *kv), stats.get("shed_budget", 0), *kv,
                                "budget")
                export.count_to(export.expired, ("e", *kv), stats.get("expired", 0), *kv)
                d_batches = stats.get("batches", 0) - last.get("batches", 0)
                d_rows = stats.get("rows", 0) - last.get("rows", 0)
                shed = sum(stats.get(k, 0) - last.get(k, 0)
                           for k in ("shed_queue_full", "shed_budget", "expired"))
                models[f"{name}:{v}"] = {
                    "model": name, "version": v, "queue": queued, "slo_ms": slo,
                    "batch_mean": round(d_rows / d_batches, 2) if d_batches else None,
                    "shed": shed}
            models.setdefault(name, {"model": name, "versions": versions, "slo_ms": slo})
            models[name]["versions"] = versions
        if point is not None:
            point["models"] = models
        if rollouts is not None:
            # Every check of a running rollout is exposed from zero, so a rollback is a rise
            # (``increase()`` sees no rise in a series that first appears at 1).
            counts = dict.fromkeys(((m, c) for m in list(rollouts.active)
                                    for c in rollouts.CHECKS), 0)
            counts.update(rollouts.rollbacks)
            for (model, check), n in counts.items():
                export.count_to(export.rollbacks, ("rollback", model, check), n, model, check)
        pstats: Any = _pipeline_stats(self.pipeline)
        if pstats:
            breaker: dict[str, Any] = pstats.get("breaker") or {}
            export.breaker.labels("online_store").set(
                BREAKER_LEVEL.get(str(breaker.get("state", "closed")), 0))
            export.count_to(export.breaker_opens, ("opens",), breaker.get("opens", 0) or 0,
                            "online_store")
            for cache, label in (("prediction_cache", "prediction"), ("feature_cache", "feature")):
                c: dict[str, Any] = pstats.get(cache) or {}
                export.count_to(export.cache_hits, ("h", label), c.get("hits", 0) or 0, label)
                export.count_to(export.cache_misses, ("m", label), c.get("misses", 0) or 0,
                                label)
            export.count_to(export.degraded, ("degraded",), pstats.get("degraded", 0) or 0)
            entities: dict[str, Any] = pstats.get("entities") or {}
            if entities:
                export.count_to(export.entity_rows, ("ef",), entities.get("found", 0), "found")
                export.count_to(export.entity_rows, ("em",), entities.get("missing", 0),
                                "missing")
                export.entities_lost.set(1 if entities.get("lost") else 0)
            if point is not None:
                point["pipeline"] = {"breaker": breaker.get("state"),
                                     "degraded": pstats.get("degraded", 0)}


def loaded_versions(registry: LoadedModels, name: str) -> list[ServedVersion]:
    """The handles of ``name``'s loaded versions (none while it is unloading)."""
    try:
        return list(registry.loaded(name))
    except Exception:  # noqa: BLE001 - unloading right now
        return []


def _pipeline_stats(pipeline: PipelineCounters | None) -> dict[str, Any]:
    if pipeline is None:
        return {}
    try:
        return dict(pipeline.stats())
    except Exception:  # noqa: BLE001
        return {}
