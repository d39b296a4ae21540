"""Entity predictions (``/v1``): the orchestration of one request, stage by stage.

1. **decode** — entity keys and request fields checked against the route (the edge parsed the
   wire form and the budget already).
2. **features** — one coalesced, budget-bound read (``features.py``), then request-time
   transforms on the fetched columns.
3. **sessions** — when a ``session_id`` is given, its counters and last events are updated and
   read atomically in the shared store (``session_access.py``, over ``sessions.py``).
4. **admission** — the primary unless the budget left is below its recent p99 (``latency.py``,
   which ages and probes), else the fallback model or the default answer.
5. **queue / inference** — ``ModelHandle.infer`` within the budget.

Each stage is a span on the request's :class:`~redline.serving.stages.RequestRecord`;
``timings_us`` in the answer is read from it. Transport-free: the edges (``serving/v1_rest.py``,
``serving/v1_grpc.py``) build the :class:`PredictRequest` and encode the answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from redline.config import Settings
from redline.errors import (
    DeadlineExceeded,
    FeatureNotFound,
    ModelNotReady,
    Overloaded,
    RedlineError,
)
from redline.features.definitions import FeatureDefinitions, RequestTransform
from redline.features.ingest import EventPush, Ingestor
from redline.features.online.base import OnlineStore
from redline.serving.deadline import Budget
from redline.serving.entity_loss import EntityLossDetector
from redline.serving.handle import ModelHandle
from redline.serving.predict.breaker import CircuitBreaker
from redline.serving.predict.cache import FeatureNearCache, PredictionCache
from redline.serving.predict.checks import VersionChecks
from redline.serving.predict.features import FeatureRead
from redline.serving.predict.graph_request import run_graph
from redline.serving.predict.latency import LatencyWindow
from redline.serving.predict.plan import ModelPlan, Route
from redline.serving.predict.request import PredictRequest, entity_ids, request_columns
from redline.serving.predict.session_access import SessionAccess
from redline.serving.predict.session_events import SessionEventWriter, load_catalogue
from redline.serving.predict.sessions import (
    SessionItem,
    SessionState,
    SessionStore,
)
from redline.serving.registry import HandleLookup
from redline.serving.stages import ADMISSION, DECODE, FEATURES, SESSIONS, RequestRecord, perf_ns

if TYPE_CHECKING:
    from redline.serving.predict.redis_loop import LoopRedis

log = logging.getLogger("redline.serving.predict")

PRIMARY, FALLBACK, CACHE, DEFAULT = "primary", "fallback", "cache", "default"


class PredictPipeline:
    """Serves ``/v1`` predicts; its collaborators (store, sessions, caches) come in built."""

    def __init__(self, registry: HandleLookup, settings: Settings,
                 definitions: FeatureDefinitions | None, store: OnlineStore | None,
                 sessions: SessionStore, checks: VersionChecks | None = None) -> None:
        self.registry = registry
        self.settings = settings
        self.defs = definitions
        self.store = store
        cfg = settings.pipeline
        cache = settings.cache
        self.breaker = CircuitBreaker(cfg.breaker_failures, cfg.breaker_reset_ms / 1000.0,
                                      cfg.breaker_reset_ms * 8 / 1000.0)
        self.predictions = PredictionCache(cache.prediction_cache_entries,
                                           cache.prediction_cache_ttl_s)
        near = FeatureNearCache(cache.feature_cache_entries, cache.feature_cache_max_staleness_ms,
                                cache.feature_cache_fallback_staleness_ms)
        self.features = FeatureRead(self.breaker, near, remote=store is not None
                                    and store.kind != "memory",
                                    loop_redis=_loop_redis(store, settings),
                                    spin_s=max(0.0, settings.features.redis_spin_us) / 1e6)
        self.sessions = sessions
        self.catalogue = (load_catalogue(cfg.session_catalogue) if cfg.session_catalogue
                          else None)
        self.session_events = SessionEventWriter(sessions, self.catalogue)
        self.session_access = SessionAccess(sessions, self.breaker, self.features,
                                            self.session_events)
        self.max_instances = cfg.max_instances
        self._routes: dict[tuple[Any, ...], Route] = {}
        self._latency: dict[tuple[str, int], LatencyWindow] = {}
        self.paths = {PRIMARY: 0, FALLBACK: 0, CACHE: 0, DEFAULT: 0}
        self.degraded = 0
        self._ingestor: Ingestor | None = None
        # ``POST /v1/events``: a Redis store is written off the loop, in arrival order
        self.event_push = EventPush(lambda: self.ingestor,
                                    on_loop=store is None or store.kind == "memory")
        # The load-time checks, which load each graph version's parts (None: no graph serves).
        self.checks = checks
        f = settings.features
        # Rows read from a reachable store, found or missing: a store that lost its data.
        self.entity_loss = EntityLossDetector(f.entity_loss_window_s, f.entity_loss_min_rows,
                                              f.entity_loss_jump,
                                              f.entity_loss_baseline_half_life_s, f.redis_url)

    @property
    def near(self) -> FeatureNearCache:
        return self.features.near

    @property
    def ingestor(self) -> Ingestor:
        """The features package's ingest into this pipeline's store (``POST /v1/events``,
        ``redline serve --replay``); needs feature definitions and a store."""
        if self._ingestor is None:
            if self.defs is None or self.store is None:
                raise FeatureNotFound("no feature definitions are loaded; set "
                                      "features.definitions in redline.yaml")
            self._ingestor = Ingestor(self.defs, self._ingest_store(),
                                      sessions=self.session_events)
        return self._ingestor

    def _ingest_store(self) -> OnlineStore:
        """The store ingest writes through: the memory store itself; for Redis, a connection
        of its own with the ingest timeout (the request path's is tuned for budgets of
        milliseconds, and gives up rather than retries)."""
        assert self.store is not None
        if self.store.kind == "memory":
            return self.store
        from redline.features.online import open_online_store

        return open_online_store(self.settings.features,
                                 timeout_ms=self.settings.features.ingest_timeout_ms)

    # ------------------------------------------------------------------ the request
    async def predict(self, name: str, req: PredictRequest,
                      budget_of: Callable[[ModelHandle], Budget],
                      record: RequestRecord) -> dict[str, Any]:
        """Serve one request; the answer is a JSON-ready dict (see ``docs/pipeline.md``).

        ``budget_of(handle)`` is the request's :class:`Budget` once the model (and so its SLO)
        is known: the edge parsed what the client sent; this applies the model's default.
        """
        reasons: list[str] = []
        handle = self.registry.get(name, req.version, key=req.entities)
        record.model, record.version = handle.name, handle.version_str
        budget: Budget = budget_of(handle)
        graph = self.checks.graph(handle) if self.checks is not None else None
        if graph is not None:
            t = _mark(record, DECODE, record.start_ns)
            return await run_graph(graph, handle, req, budget, self._window(handle),
                                   self, record, t)
        route = self.route(handle)
        n = len(req.entities)
        record.rows = n
        ids = entity_ids(route.keys, route.entity_names, route.model, req.entities, req.batch)
        fields = request_columns(route.request_fields, route.model, req.fields, req.batch)
        t = _mark(record, DECODE, record.start_ns)
        window = self._window(handle)
        got = await self.features.read(route, ids, n, budget, window.estimate(), reasons)
        feats, missing = got[0], got[1]
        if not reasons and route.reader is not None:
            self.entity_loss.count(n, int(np.count_nonzero(missing)))
        if len(got) > 2:
            _feature_age(record, got[2])
        t = _mark(record, FEATURES, t)
        session = None
        if req.session_id is not None:
            session = self.session_access.update(req, fields, reasons)
            t = _mark(record, SESSIONS, t)
        plan, path = self._choose(route, budget, window, reasons)
        t = _mark(record, ADMISSION, t)
        outputs: dict[str, np.ndarray] | None = None
        cached = 0
        if plan is not None:
            x = _assemble(plan, route, feats, fields, session, n)
            t = _mark(record, FEATURES, t)  # request-time transforms
            try:
                # A fallback is the last resort: it runs even if the budget is spent already.
                outputs, cached = await self._run(plan, x, budget if path == PRIMARY else None,
                                                  window if path == PRIMARY else None, record)
            except (Overloaded, DeadlineExceeded, ModelNotReady) as exc:
                if path != PRIMARY:
                    raise
                plan, path = self._cheaper(route, reasons, f"primary refused: {exc.code}")
                if path == PRIMARY:
                    raise  # nothing cheaper configured: the refusal stands
                if plan is not None:
                    x = _assemble(plan, route, feats, fields, session, n)
                    outputs, cached = await self._run(plan, x, None, None, record)
            if outputs is not None and cached == n and path == PRIMARY:
                path = CACHE
            attrs = record.attributes
            if attrs and "degraded_reasons" in attrs:  # a graph's steps fell back
                reasons.extend(attrs.pop("degraded_reasons"))
        self.paths[path] += 1
        if reasons:
            self.degraded += 1
        record.path = path
        return self._answer(req, handle, plan, path, outputs, missing, session, reasons, record)

    def _choose(self, route: Route, budget: Budget, window: LatencyWindow,
                reasons: list[str]) -> tuple[ModelPlan | None, str]:
        """The primary unless the budget left is below its recent p99 (and this is no probe)."""
        p99 = window.estimate()
        if not p99 or budget.fits(p99, 0.0) or window.probe():
            return route.primary, PRIMARY
        return self._cheaper(route, reasons, f"budget: {max(0.0, budget.left()) * 1e3:.2f} ms "
                                             f"left < model p99 {p99 * 1e3:.2f} ms")

    def _cheaper(self, route: Route, reasons: list[str], why: str
                 ) -> tuple[ModelPlan | None, str]:
        if route.fallback is not None:
            reasons.append(f"{why}: served by fallback model '{route.fallback.handle.name}'")
            return route.fallback, FALLBACK
        if self.settings.for_model(route.model).default_answer is not None:
            reasons.append(f"{why}: served the configured default answer")
            return None, DEFAULT
        return route.primary, PRIMARY  # nothing cheaper configured: try the primary anyway

    def session_items(self, session_id: str, limit: int | None = None,
                      reasons: list[str] | None = None) -> list[SessionItem]:
        """The session's items, most recent first (:meth:`SessionAccess.items`)."""
        return self.session_access.items(session_id, limit, reasons)

    async def read_session_items(self, session_id: str, limit: int | None, budget: Budget,
                                 reserve_s: float, reasons: list[str]) -> list[SessionItem]:
        """The session's items for a request, bound by its budget
        (:meth:`SessionAccess.read_items`)."""
        return await self.session_access.read_items(session_id, limit, budget, reserve_s,
                                                    reasons)

    def add_session_events(self, session_id: str, items: list[SessionItem]) -> SessionState:
        """Store a session's new item events (:meth:`SessionAccess.add_events`)."""
        return self.session_access.add_events(session_id, items)

    async def _run(self, plan: ModelPlan, x: np.ndarray, budget: Budget | None,
                   window: LatencyWindow | None, record: RequestRecord
                   ) -> tuple[dict[str, np.ndarray], int]:
        """Outputs for every row (cached rows from the prediction cache) and how many hit it."""
        handle = plan.handle
        cache = self.predictions if self.predictions.enabled else None
        if cache is None:
            t0 = perf_ns()
            out = await handle.infer({plan.input_name: x}, budget, record=record)
            if window is not None:
                window.add((perf_ns() - t0) * 1e-9)
            return out, 0
        rows = [x[r].tobytes() for r in range(x.shape[0])]
        hits = [cache.get(handle.name, handle.version, b) for b in rows]
        todo = [r for r, h in enumerate(hits) if h is None]
        if todo:
            t0 = perf_ns()
            ran = await handle.infer({plan.input_name: x[todo]}, budget, record=record)
            if window is not None:
                window.add((perf_ns() - t0) * 1e-9)
            attrs = record.attributes  # a graph whose steps fell back: not an answer to keep
            keep = not (attrs and "degraded_reasons" in attrs)
            for k, r in enumerate(todo):
                row_out = {name: v[k:k + 1] for name, v in ran.items()}
                if keep:
                    cache.put(handle.name, handle.version, rows[r], row_out)
                hits[r] = row_out
        out = {name: np.concatenate([h[name] for h in hits])  # type: ignore[index]
               for name in handle.output_names}
        return out, x.shape[0] - len(todo)

    # ------------------------------------------------------------------ routes
    def route(self, handle: ModelHandle) -> Route:
        """The route for this handle (cached per primary and fallback version)."""
        fb_handle = self._fallback_handle(handle)
        key = (handle.name, handle.version, id(handle),
               fb_handle.name if fb_handle else None, id(fb_handle) if fb_handle else None)
        route = self._routes.get(key)
        if route is None:
            if self._is_default(handle) and (
                    self.predictions.observe_version(handle.name, handle.version)
                    | self.near.observe_version(handle.name, handle.version)):
                log.info("model %s: version %s now served, caches dropped its entries",
                         handle.name, handle.version)
            primary = ModelPlan(handle, self.defs)
            fallback = None
            if fb_handle is not None:
                try:
                    fallback = ModelPlan(fb_handle, self.defs)
                except RedlineError as exc:
                    log.warning("model %s: fallback %s cannot serve /v1: %s", handle.name,
                                fb_handle.name, exc)
            route = Route(primary, fallback, self.store)
            # Forget routes of versions no longer loaded (a pinned version stays routed).
            loaded = {id(h) for h in self.registry.loaded(handle.name)}
            for k, old in list(self._routes.items()):
                if k[0] == handle.name and k[2] not in loaded:
                    self.features.forget(old)
                    del self._routes[k]
            self._routes[key] = route
        return route

    def _is_default(self, handle: ModelHandle) -> bool:
        """Whether ``handle`` is the version served by default (its change drops caches)."""
        try:
            return self.registry.get(handle.name) is handle
        except RedlineError:
            return False

    def _fallback_handle(self, handle: ModelHandle) -> ModelHandle | None:
        name = handle.fallback
        if not name or name == handle.name:
            return None
        try:
            return self.registry.get(name)
        except RedlineError:
            return None

    def _window(self, handle: ModelHandle) -> LatencyWindow:
        key = (handle.name, handle.version)
        w = self._latency.get(key)
        if w is None:
            cfg = self.settings.pipeline
            w = self._latency[key] = LatencyWindow(cfg.latency_window, cfg.latency_window_s,
                                                   cfg.probe_interval_ms / 1000.0)
        return w

    # ------------------------------------------------------------------ the answer
    def _answer(self, req: PredictRequest, handle: ModelHandle, plan: ModelPlan | None,
                path: str, outputs: dict[str, np.ndarray] | None, missing: np.ndarray,
                session: SessionState | None, reasons: list[str], record: RequestRecord
                ) -> dict[str, Any]:
        served = plan.handle if plan is not None else handle
        if outputs is not None and plan is not None:
            preds = _predictions(plan, outputs, len(missing))
        else:
            answer = self.settings.for_model(handle.name).default_answer or []
            value: Any = answer[0] if len(answer) == 1 else list(answer)
            preds = [{"prediction": value} for _ in range(len(missing))]
        for r, pred in enumerate(preds):
            pred["entity_missing"] = bool(missing[r])
        doc: dict[str, Any] = {
            "model_name": served.name,
            "model_version": served.version_str,
            "path": path,
            "degraded": bool(reasons),
            "degraded_reasons": reasons,
        }
        if req.request_id is not None:
            doc["request_id"] = req.request_id
        if req.batch:
            doc["predictions"] = preds
        else:
            doc.update(preds[0])
        if session is not None:
            doc["session"] = session.to_dict()
        doc["timings_us"] = record.timings_us()
        return doc

    # ------------------------------------------------------------------ operations
    def stats(self) -> dict[str, Any]:
        return {
            "paths": dict(self.paths), "degraded": self.degraded,
            "store": self.store.kind if self.store is not None else None,
            "breaker": self.breaker.as_dict(),
            "prediction_cache": self.predictions.stats(), "feature_cache": self.near.stats(),
            "sessions": self.sessions.kind,
            "p99_ms": {f"{n}:{v}": round(w.estimate() * 1e3, 3)
                       for (n, v), w in self._latency.items()},
            "probes": sum(w.probes for w in self._latency.values()),
            "entities": self.entity_loss.as_dict(),
            "store_reads": {f"{k[0]}:{k[1]}": {"calls": f.calls, "requests": f.requests}
                            for k, r in self._routes.items()
                            if (f := self.features.made(r)) is not None},
        }

    def close(self) -> None:
        """Release the worker thread and the online store's connections (at shutdown)."""
        self.event_push.close()
        self.features.close()
        if self.store is not None and self.store.kind != "memory":
            self.store.close()
            if self._ingestor is not None:
                self._ingestor.store.close()
        self.sessions.close()


def _loop_redis(store: OnlineStore | None, settings: Settings) -> LoopRedis | None:
    """The event loop's own Redis connection for feature reads, where it applies (a single
    Redis over plain TCP and ``features.redis_loop_reads``); else reads use a worker thread."""
    if store is None or store.kind != "redis" or not settings.features.redis_loop_reads:
        return None
    from redline.features.online.redis import RedisStore
    from redline.serving.predict.redis_loop import LoopRedis, supports

    if not isinstance(store, RedisStore) or store.cluster or not supports(store.url):
        return None
    return LoopRedis(store.url, settings.features.redis_timeout_ms / 1000.0)


def _feature_age(record: RequestRecord, newest_ms: np.ndarray) -> None:
    """``feature_age_s`` (``redline_feature_age_seconds``): now minus the newest event time of
    the stalest view the read found data in; nothing when no view had any."""
    times = [x for x in newest_ms.ravel().tolist() if x == x]
    if times:
        attrs = record.attributes
        if attrs is None:
            attrs = record.attributes = {}
        attrs["feature_age_s"] = max(0.0, time.time() - min(times) / 1000.0)


def _mark(record: RequestRecord, stage: str, since: int) -> int:
    t = perf_ns()
    record.add(stage, since, t)
    return t


def _assemble(plan: ModelPlan, route: Route, feats: np.ndarray, fields: dict[str, np.ndarray],
              session: SessionState | None, n: int) -> np.ndarray:
    x = np.empty((n, plan.width), dtype=plan.dtype)
    col = route.col
    for j, (kind, what) in enumerate(plan.columns):
        if kind == "feature":
            x[:, j] = feats[:, col[what]]  # type: ignore[index]
        elif kind == "request":
            x[:, j] = fields[what]  # type: ignore[index]
        elif kind == "transform":
            t = cast(RequestTransform, what)
            args = [fields[f] for f in t.request]
            args += [feats[:, col[ref]].astype(np.float64) for ref in t.features]
            x[:, j] = t.compute(args) if args else t.default
        else:  # session counter; 0 when there is no session (or its store is down)
            x[:, j] = session.counters.get(what, 0.0) if session is not None else 0.0  # type: ignore[arg-type]
    return x


def _predictions(plan: ModelPlan, outputs: dict[str, np.ndarray], n: int) -> list[dict[str, Any]]:
    """One dict per row: ``prediction`` (positive-class probability for a binary classifier,
    the label for a multi-class one, the value for a regressor) and ``label`` if there is one."""
    names = plan.output_names
    probs = next((outputs[k] for k in names if outputs[k].ndim == 2 and outputs[k].shape[1] > 1
                  and outputs[k].dtype.kind == "f"), None)
    label = next((outputs[k] for k in names if outputs[k].ndim == 1
                  and outputs[k].dtype.kind in "iu"), None) if plan.classification else None
    rows: list[dict[str, Any]] = []
    if plan.classification and probs is not None and probs.shape[1] == 2:
        score = probs[:, 1].tolist()
        for r in range(n):
            row: dict[str, Any] = {"prediction": score[r]}
            if label is not None:
                row["label"] = int(label[r])
            rows.append(row)
        return rows
    main = label if label is not None else outputs[names[0]]
    flat = main.reshape(n, -1)
    for r in range(n):
        values = flat[r].tolist()
        rows.append({"prediction": values[0] if len(values) == 1 else values})
    return rows
