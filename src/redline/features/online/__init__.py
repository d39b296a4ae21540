"""Online stores: ``memory`` (embedded default) and ``redis`` (shared by replicas and ingest)."""

from __future__ import annotations

from typing import Any

from redline.errors import ConfigError
from redline.features.online.base import EntityIds, FeatureReader, OnlineStore, ReadPlan, now_ms
from redline.features.online.memory import MemoryStore


def open_online_store(settings: Any, timeout_ms: float | None = None) -> OnlineStore:
    """The store ``features:`` settings name (a :class:`redline.config.FeatureSettings`).

    ``timeout_ms`` overrides ``redis_timeout_ms`` — serving wants a short socket timeout, bulk
    ingest a long one (a 5,000-event batch runs for tens of milliseconds inside Redis)."""
    if settings.store == "memory":
        return MemoryStore()
    if settings.store == "redis":
        from redline.features.online.redis import RedisStore

        return RedisStore(settings.redis_url, cluster=settings.redis_cluster,
                          timeout_ms=timeout_ms or settings.redis_timeout_ms,
                          wait_replicas=settings.redis_wait_replicas,
                          wait_timeout_ms=settings.redis_wait_timeout_ms)
    raise ConfigError(f"features.store must be 'memory' or 'redis', got {settings.store!r}")


__all__ = ["EntityIds", "FeatureReader", "MemoryStore", "OnlineStore", "ReadPlan", "now_ms",
           "open_online_store"]
