"""``/v1`` entity predictions: request, route plan, feature read, sessions, orchestration.

Each module has one job and takes its collaborators through its constructor; none knows HTTP or
gRPC (the edges are ``serving/v1_rest.py`` and ``serving/v1_grpc.py``). :func:`open_features`
opens the definitions and store ``redline.yaml`` names, :class:`VersionChecks` checks each
loaded version against them, and :func:`build_pipeline` wires the pipeline over them.
"""

from __future__ import annotations

from redline.config import Settings
from redline.features.definitions import FeatureDefinitions
from redline.features.online.base import OnlineStore
from redline.serving.predict.checks import VersionChecks
from redline.serving.predict.pipeline import CACHE, DEFAULT, FALLBACK, PRIMARY, PredictPipeline
from redline.serving.predict.request import PredictRequest, parse_request
from redline.serving.predict.sessions import MemorySessionStore, RedisSessionStore, SessionStore
from redline.serving.registry import ModelRegistry


def open_features(settings: Settings) -> tuple[FeatureDefinitions | None, OnlineStore | None]:
    """The live feature definitions and the online store ``redline.yaml`` names (both None
    without ``features.definitions``)."""
    if not settings.features.definitions:
        return None, None
    from redline.features.definitions import load_definitions
    from redline.features.versioning import ViewRegistry, live_definitions

    # the registry decides which version of each view serves (`features apply`)
    defs = live_definitions(load_definitions(settings.features.definitions),
                            ViewRegistry(settings.features.registry))
    return defs, open_store(settings, defs)


def build_pipeline(registry: ModelRegistry, settings: Settings,
                   definitions: FeatureDefinitions | None, store: OnlineStore | None,
                   checks: VersionChecks) -> PredictPipeline:
    """The pipeline over ``open_features``' definitions and store, with the sessions
    ``redline.yaml`` names; ``checks`` are the registry's (the graphs they load)."""
    return PredictPipeline(registry, settings, definitions, store,
                           open_sessions(store, settings), checks)


def open_store(settings: Settings, defs: FeatureDefinitions) -> OnlineStore:
    """The online store ``features.store`` names (memory: embedded; redis: shared)."""
    from redline.features.online import MemoryStore, open_online_store

    store = open_online_store(settings.features)
    if isinstance(store, MemoryStore):
        store.register(list(defs.views.values()))
    else:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from redline.features.online.redis import RedisStore

        assert isinstance(store, RedisStore)
        # No retries on the request path (redis-py retries a refused connection with backoff,
        # several times what the failed read costs): a failed read degrades at once and the
        # circuit breaker decides when to try the store again. ``set_retry`` is redis-py's
        # public API for this.
        store.client.set_retry(Retry(NoBackoff(), 0))
    return store


def open_sessions(store: OnlineStore | None, settings: Settings) -> SessionStore:
    """Sessions in the shared store when it is Redis, else in this process."""
    cfg = settings.pipeline
    if store is not None and store.kind == "redis":
        from redline.features.online.redis import RedisStore

        assert isinstance(store, RedisStore)
        from redline.features.online.redis import connect

        # Event posts and session reads outside a request's budget get their own, patient
        # connection: the store's request-path timeout is tuned for budgets of milliseconds.
        patient = connect(store.url, cluster=store.cluster,
                          timeout_ms=max(cfg.session_events_timeout_ms,
                                         settings.features.redis_timeout_ms))
        return RedisSessionStore(store.client, store.url, cfg.session_ttl_s,
                                 cfg.session_max_events, cfg.session_max_items,
                                 patient_client=patient)
    return MemorySessionStore(cfg.session_ttl_s, cfg.session_max_events, cfg.session_max_items)


__all__ = ["CACHE", "DEFAULT", "FALLBACK", "PRIMARY", "PredictPipeline", "PredictRequest",
           "VersionChecks", "build_pipeline", "open_features", "open_sessions", "open_store",
           "parse_request"]
