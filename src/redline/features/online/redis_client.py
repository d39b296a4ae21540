"""Connecting to Redis (one server, a Cluster, or a Sentinel service's primary) and turning a
connection failure into :class:`StoreUnavailable` that names the URL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import redis
import redis.cluster

from redline.errors import ConfigError, StoreUnavailable
from redline.features.online.redis_sentinel import is_sentinel_url, sentinel_client

T = TypeVar("T")
# what a lost, refused, timed-out or failing-over connection raises
CONNECTION_ERRORS = (
    redis.ConnectionError, redis.TimeoutError, redis.cluster.ClusterDownError,
    redis.exceptions.ClusterError, redis.exceptions.RedisClusterException,
    redis.exceptions.MasterDownError, redis.exceptions.TryAgainError, OSError)


def connect(url: str, *, cluster: bool = False, timeout_ms: float = 50.0) -> Any:
    """A redis-py client (or cluster client) for ``url``; the factory sessions reuse too. A
    ``redis+sentinel://`` URL gives a client of the service's current primary, which follows a
    failover (``redis_sentinel``)."""
    timeout = timeout_ms / 1000.0
    kw = dict(socket_timeout=timeout, socket_connect_timeout=max(timeout, 0.5))
    if is_sentinel_url(url):
        if cluster:
            raise ConfigError(f"{url} names a Sentinel service (one primary and its replicas); "
                              "set features.redis_cluster: false, or name a Cluster node instead")
        return sentinel_client(url, **kw)
    if cluster:
        return redis.RedisCluster.from_url(url, **kw)
    return redis.Redis.from_url(url, **kw)


def guarded(url: str, fn: Callable[[], T]) -> T:
    """Run ``fn``; a connection failure becomes :class:`StoreUnavailable` naming the URL."""
    try:
        return fn()
    except CONNECTION_ERRORS as exc:
        raise StoreUnavailable(
            f"Redis online store at {url} is unavailable ({type(exc).__name__}: {exc}); check that "
            "redis-server runs and features.redis_url points at it"
        ) from exc

