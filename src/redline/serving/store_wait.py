"""Start-up's patience with a shared online store that is slow or not up yet.

A request may give up on Redis after ``features.redis_timeout_ms`` (tens of milliseconds) and
degrade; a start-up step that must write the store (``features.preload`` into Redis) cannot. On a
loaded machine one reply later than that timeout would end the start, so before such a step the
server waits for the store to answer (``wait_for_store``, logging what it waits for) and runs the
step with a read timeout as long as the start-up deadline (``patient``): a write is never sent
twice, so nothing is counted twice.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from redline.errors import StoreUnavailable

if TYPE_CHECKING:
    from redline.features.online.base import OnlineStore
    from redline.features.online.redis import RedisStore

log = logging.getLogger("redline.serving")

STARTUP_DEADLINE_S = 60.0  # how long a start waits for its online store before it gives up
_LOG_EVERY_S = 5.0


def wait_for_store(store: OnlineStore, deadline_s: float = STARTUP_DEADLINE_S) -> None:
    """Return once ``store`` answers a ping; raise its ``StoreUnavailable`` (with how long it
    was waited for) when it has not within ``deadline_s``. A memory store returns at once."""
    redis_store = _redis(store)
    if redis_store is None:
        return
    started = time.monotonic()
    last_log = None
    while True:
        try:
            with patient(redis_store, min(1.0, deadline_s)):
                redis_store.ping()
            if last_log is not None:
                log.info("start-up: online store %s answers after %.1f s", redis_store.url,
                         time.monotonic() - started)
            return
        except StoreUnavailable as exc:
            waited = time.monotonic() - started
            if waited >= deadline_s:
                raise StoreUnavailable(f"{exc.message} (waited {waited:.0f} s at start-up)"
                                       ) from exc
            if last_log is None or time.monotonic() - last_log >= _LOG_EVERY_S:
                last_log = time.monotonic()
                log.warning("start-up: waiting for the online store %s (%.0f s of %.0f s): %s",
                            redis_store.url, waited, deadline_s, exc.message)
            time.sleep(0.25)


@contextlib.contextmanager
def patient(store: OnlineStore, timeout_s: float = STARTUP_DEADLINE_S) -> Iterator[None]:
    """Within the block, the store's Redis connections wait up to ``timeout_s`` for a reply
    (a single Redis; a cluster client keeps its own timeouts)."""
    redis_store = _redis(store)
    # redis-py's clients: a single Redis has one pool, a cluster client a pool per node
    pool: Any = (getattr(redis_store.client, "connection_pool", None)
                 if redis_store is not None else None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if pool is None or not isinstance(kwargs, dict) or "socket_timeout" not in kwargs:
        yield
        return
    before = kwargs["socket_timeout"]
    kwargs["socket_timeout"] = timeout_s
    pool.disconnect()  # connections made with the request timeout are made again
    try:
        yield
    finally:
        kwargs["socket_timeout"] = before
        pool.disconnect()


def _redis(store: OnlineStore) -> RedisStore | None:
    """``store`` when it is a Redis store (the one kind start-up waits for), else None; the
    Redis client is imported only then (a memory store's server may not have it)."""
    if store.kind == "memory":
        return None
    from redline.features.online.redis import RedisStore

    return store if isinstance(store, RedisStore) else None
