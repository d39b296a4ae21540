"""Entity predictions: ``POST /v1/models/{name}/predict`` — "score this card at this merchant, now".

One request (or a batch of rows) goes through these stages, each timed:

1. **parse** — entity keys, request fields, optional session id, request id and budget.
2. **features** — the model's online features for every row in ONE store round trip (the store's
   reader covers every view the model — and its fallback — was trained on). A hot entity may come
   from the near cache. If the store is slow or down the circuit breaker opens, so later requests
   skip it at no cost, and rows come from the near cache (bounded staleness) or the features'
   declared defaults; the response says ``degraded`` and why.
3. **session** — when a ``session_id`` is given, its counters and last events are updated and read
   atomically in the shared store (``serving/sessions.py``).
4. **transform** — request-time transforms (``amount / card mean``) on the fetched columns.
5. **model** — the input is assembled in the model's feature order and run through the model's
   batcher within the budget. If the budget left is below the model's recent p99, or the model
   sheds the request, the configured fallback model or default answer serves instead.

A model's ``feature_names`` say where each input column comes from: ``view:feature`` is an online
feature, a transform's name is that transform, ``session:<counter>`` a session counter, anything
else a request field. Its ``feature_views`` pin view versions; serving it against other live
versions is refused (:class:`~redline.errors.VersionMismatch`), never silently skewed.

The store read is a synchronous call on the event loop on purpose: against a local Redis it
costs less than a hop to a thread would, and the socket timeout (``features.redis_timeout_ms``)
and the breaker bound what a sick Redis can cost.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from redline.config import Settings
from redline.errors import (
    DeadlineExceeded,
    FeatureNotFound,
    InvalidInput,
    ModelNotReady,
    Overloaded,
    RedlineError,
    VersionMismatch,
)
from redline.models.datatypes import V2_TO_NUMPY
from redline.serving.breaker import CircuitBreaker
from redline.serving.cache import FeatureNearCache, PredictionCache
from redline.serving.deadline import BUDGET_HEADER, now
from redline.serving.fetcher import FeatureFetcher
from redline.serving.handle import ModelHandle
from redline.serving.registry import ModelRegistry
from redline.serving.sessions import (
    MemorySessionStore,
    RedisSessionStore,
    SessionState,
    SessionStore,
    check_session_id,
)

log = logging.getLogger("redline.serving.pipeline")

PRIMARY, FALLBACK, CACHE, DEFAULT = "primary", "fallback", "cache", "default"
_SESSION = "session:"


# ---------------------------------------------------------------------- the request, parsed
@dataclass(slots=True)
class PredictRequest:
    """A decoded ``/v1`` request: one row per instance. Shared by REST and gRPC."""

    entities: list[dict[str, Any]]
    fields: list[dict[str, Any]]
    batch: bool
    session_id: str | None = None
    request_id: str | None = None
    budget_ms: float | None = None
    version: str | None = None


def parse_request(doc: Any, max_instances: int) -> PredictRequest:
    """The REST body: one instance inline, or ``{"instances": [...]}`` for many."""
    if not isinstance(doc, dict):
        raise InvalidInput("the request body must be a JSON object with 'entities' and 'request' "
                           "(or 'instances': [...])")
    batch = "instances" in doc
    if batch:
        rows = doc["instances"]
        if not isinstance(rows, list) or not rows:
            raise InvalidInput("'instances' must be a non-empty list of {entities, request}")
        if len(rows) > max_instances:
            raise InvalidInput(f"{len(rows)} instances exceed pipeline.max_instances "
                               f"({max_instances}); split the batch")
    else:
        rows = [doc]
    entities, fields = [], []
    for i, row in enumerate(rows):
        where = f"instances[{i}]" if batch else "body"
        if not isinstance(row, dict):
            raise InvalidInput(f"{where} must be an object with 'entities' and 'request'")
        ent = row.get("entities", {})
        req = row.get("request", {})
        if not isinstance(ent, dict):
            raise InvalidInput(f"{where}.entities must be an object of entity key -> id")
        if not isinstance(req, dict):
            raise InvalidInput(f"{where}.request must be an object of field -> value")
        entities.append(ent)
        fields.append(req)
    session_id = doc.get("session_id")
    if session_id is not None:
        session_id = check_session_id(session_id)
    request_id = doc.get("request_id", doc.get("id"))
    if request_id is not None and not isinstance(request_id, str):
        request_id = str(request_id)
    budget = doc.get("budget_ms")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float)
                               or not budget > 0 or budget == math.inf):
        raise InvalidInput(f"budget_ms must be a positive number of milliseconds, got {budget!r}")
    version = doc.get("model_version")
    return PredictRequest(entities, fields, batch, session_id, request_id,
                          float(budget) if budget is not None else None,
                          str(version) if version is not None else None)


# ---------------------------------------------------------------------- per model: input columns
class ModelPlan:
    """How one model version's input row is built from features, transforms, session, request."""

    def __init__(self, handle: ModelHandle, defs: Any) -> None:
        meta = handle.metadata
        self.handle = handle
        names = meta.feature_names
        if not names:
            raise InvalidInput(
                f"model '{meta.name}' version {meta.version} records no feature_names, so /v1 "
                "cannot assemble its input; register it with feature_names (or use /v2 infer)"
            )
        specs = handle.session.inputs
        if len(specs) != 1 or len(specs[0].shape) != 2:
            raise InvalidInput(
                f"model '{meta.name}' must have one 2-D input [rows, features] to serve on /v1; "
                f"it has {[t.to_dict() for t in specs]}"
            )
        self.input_name = specs[0].name
        self.dtype = V2_TO_NUMPY[specs[0].datatype]
        self.check_versions(meta, defs)
        self.features: list[str] = []  # "view:feature" refs this model reads
        self.columns: list[tuple[str, Any]] = []  # (kind, what) per input column
        self.request_fields: list[str] = []
        self.views: dict[str, Any] = {}
        transforms = defs.transforms if defs is not None else {}
        for name in names:
            if name in transforms:
                t = transforms[name]
                for ref in t.features:
                    self._feature(ref, defs)
                for f in t.request:
                    self._field(f)
                self.columns.append(("transform", t))
            elif name.startswith(_SESSION):
                self.columns.append(("session", name[len(_SESSION):]))
            elif ":" in name:
                self._feature(name, defs)
                self.columns.append(("feature", name))
            else:
                self._field(name)
                self.columns.append(("request", name))
        self.width = len(names)
        self.classification = meta.task == "classification"
        self.output_names = handle.output_names

    @staticmethod
    def check_versions(meta: Any, defs: Any) -> None:
        for view, pinned in sorted(meta.feature_views.items()):
            live = defs.views.get(view) if defs is not None else None
            if live is None:
                raise VersionMismatch(
                    f"model '{meta.name}' version {meta.version} was trained on feature view "
                    f"'{view}' version {pinned}, which the loaded feature definitions do not "
                    "define; load the definitions it was trained with"
                )
            if live.version != pinned:
                raise VersionMismatch(
                    f"model '{meta.name}' version {meta.version} was trained on feature view "
                    f"'{view}' version {pinned} but version {live.version} is live; retrain the "
                    "model on the live view (or serve the definitions it was trained with)"
                )

    def _feature(self, ref: str, defs: Any) -> None:
        if defs is None:
            raise FeatureNotFound(
                f"model '{self.handle.name}' reads feature '{ref}' but no feature definitions "
                "are loaded; set features.definitions in redline.yaml"
            )
        view, _ = defs.resolve(ref)
        self.views[view.name] = view
        if ref not in self.features:
            self.features.append(ref)

    def _field(self, name: str) -> None:
        if name not in self.request_fields:
            self.request_fields.append(name)


class Route:
    """A primary model and its fallback: one reader over the views both need, entity key map."""

    def __init__(self, primary: ModelPlan, fallback: ModelPlan | None, store: Any) -> None:
        self.primary = primary
        self.fallback = fallback
        plans = [primary] + ([fallback] if fallback is not None else [])
        views: dict[str, Any] = {}
        for p in plans:
            views.update(p.views)
        self.views = list(views.values())
        self.reader = store.reader(self.views) if self.views and store is not None else None
        refs = self.reader.plan.features if self.reader is not None else []
        self.col = {ref: i for i, ref in enumerate(refs)}
        self.defaults = (self.reader.plan.defaults[self.reader.plan.take].astype(np.float32)
                         if self.reader is not None else np.zeros(0, np.float32))
        # Entity key accepted in requests (join key or entity name) -> entity name.
        self.entity_names: list[str] = []
        self.keys: dict[str, str] = {}
        for v in self.views:
            ent = v.entity
            if ent.name not in self.entity_names:
                self.entity_names.append(ent.name)
            self.keys[ent.join_key] = ent.name
            self.keys[ent.name] = ent.name
        self.request_fields = list(dict.fromkeys(f for p in plans for f in p.request_fields))
        self.fetcher: FeatureFetcher | None = None
        self.cache_key = (primary.handle.name, primary.handle.version,
                          fallback.handle.name if fallback else None,
                          fallback.handle.version if fallback else None)


class LatencyWindow:
    """The recent p99 of a model's run time (the budget-aware fallback compares against it)."""

    __slots__ = ("samples", "p99", "_since")

    def __init__(self, size: int) -> None:
        self.samples: deque[float] = deque(maxlen=max(16, size))
        self.p99 = 0.0
        self._since = 0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        self._since += 1
        if self._since >= 16 or len(self.samples) < 16:
            self._since = 0
            self.p99 = float(np.percentile(np.fromiter(self.samples, float), 99))


@dataclass(slots=True)
class Stage:
    """Per-request bookkeeping: timings and degradation reasons."""

    t: float
    timings: dict[str, int]
    reasons: list[str]

    def mark(self, name: str) -> None:
        t = now()
        self.timings[name] = int((t - self.t) * 1e6)
        self.t = t


# ---------------------------------------------------------------------- the pipeline
class PredictPipeline:
    """Owns the feature store handle, caches, breaker and sessions; serves ``/v1`` predicts."""

    def __init__(self, registry: ModelRegistry, settings: Settings, definitions: Any = None,
                 store: Any = None, sessions: SessionStore | None = None) -> None:
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
        self.near = FeatureNearCache(cache.feature_cache_entries,
                                     cache.feature_cache_max_staleness_ms,
                                     cache.feature_cache_fallback_staleness_ms)
        self.sessions = sessions if sessions is not None else _default_sessions(store, settings)
        self.max_instances = cfg.max_instances
        # Remote stores are read on one worker thread, coalesced (serving/fetcher.py).
        self._executor = (ThreadPoolExecutor(1, thread_name_prefix="redline-features")
                          if store is not None and getattr(store, "kind", "") != "memory"
                          else None)
        self._routes: dict[tuple[Any, ...], Route] = {}
        self._latency: dict[tuple[str, int], LatencyWindow] = {}
        self.paths = {PRIMARY: 0, FALLBACK: 0, CACHE: 0, DEFAULT: 0}
        self.degraded = 0

    # ------------------------------------------------------------------ wiring
    @classmethod
    def from_settings(cls, registry: ModelRegistry, settings: Settings) -> PredictPipeline:
        """Load the feature definitions and open the online store ``redline.yaml`` names."""
        defs = store = None
        features = settings.features
        if features.definitions:
            from redline.features.definitions import load_definitions

            defs = load_definitions(features.definitions)
            store = open_store(settings, defs)
        return cls(registry, settings, defs, store)

    def install(self, app: Any) -> None:
        """Add the ``/v1`` routes to the REST app."""
        app.add_route("POST", "/v1/models/{name}/predict", self._rest_predict)
        app.add_route("POST", "/v1/models/{name}/versions/{version}/predict", self._rest_predict)
        app.add_route("GET", "/v1/pipeline/stats", self._rest_stats)
        if self.defs is not None and self.store is not None:
            app.add_route("POST", "/v1/events", self._rest_events)

    # ------------------------------------------------------------------ REST
    async def _rest_predict(self, request: Any) -> Any:
        from redline.serving.app import HttpResponse

        doc = request.json()
        req = parse_request(doc, self.max_instances)
        version = request.params.get("version") or req.version
        budget_ms = req.budget_ms
        header = request.headers.get(BUDGET_HEADER)
        if budget_ms is None and header is not None:
            try:
                budget_ms = float(header)
            except ValueError:
                raise InvalidInput(
                    f"x-redline-budget-ms must be a number, got {header!r}") from None
        result = await self.predict(request.params["name"], req, version=version,
                                    budget_ms=budget_ms, start=request.start)
        return HttpResponse(200, orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY))

    async def _rest_stats(self, request: Any) -> Any:
        from redline.serving.app import HttpResponse

        return HttpResponse.json(self.stats())

    async def _rest_events(self, request: Any) -> Any:
        from redline.features.ingest import handle_events
        from redline.serving.app import HttpResponse

        status, body = await handle_events(self.ingestor, request.body)
        return HttpResponse(status, body)

    def stats(self) -> dict[str, Any]:
        return {
            "paths": dict(self.paths), "degraded": self.degraded,
            "store": getattr(self.store, "kind", None), "breaker": self.breaker.as_dict(),
            "prediction_cache": self.predictions.stats(), "feature_cache": self.near.stats(),
            "sessions": getattr(self.sessions, "kind", None),
            "p99_ms": {f"{n}:{v}": round(w.p99 * 1e3, 3) for (n, v), w in self._latency.items()},
            "store_reads": {f"{k[0]}:{k[1]}": {"calls": r.fetcher.calls,
                                               "requests": r.fetcher.requests}
                            for k, r in self._routes.items() if r.fetcher is not None},
        }

    # ------------------------------------------------------------------ gRPC (redline.v1)
    def grpc_handlers(self) -> list[Any]:
        """``redline.v1.PredictionService`` for the gRPC server (``redline_v1.proto``)."""
        import grpc

        from redline.serving.proto import redline_v1_pb2 as v1

        method = grpc.unary_unary_rpc_method_handler(
            self._grpc_predict, request_deserializer=v1.PredictRequest.FromString,  # type: ignore[attr-defined]
            response_serializer=v1.PredictResponse.SerializeToString)  # type: ignore[attr-defined]
        return [grpc.method_handlers_generic_handler("redline.v1.PredictionService",
                                                     {"Predict": method})]

    async def _grpc_predict(self, request: Any, context: Any) -> Any:
        import grpc

        from redline.serving.proto import redline_v1_pb2 as v1

        start = now()
        try:
            if not request.instances:
                raise InvalidInput("a PredictRequest needs at least one instance")
            if len(request.instances) > self.max_instances:
                raise InvalidInput(f"{len(request.instances)} instances exceed "
                                   f"pipeline.max_instances ({self.max_instances})")
            entities, fields = [], []
            for inst in request.instances:
                entities.append(dict(inst.entities))
                row: dict[str, Any] = dict(inst.request)
                for name in inst.null_fields:
                    row[name] = None
                fields.append(row)
            req = PredictRequest(
                entities, fields, request.batch or len(entities) > 1,
                check_session_id(request.session_id) if request.session_id else None,
                request.request_id or None)
            budget_ms: float | None = request.budget_ms or None
            if budget_ms is None:
                remaining = context.time_remaining()
                budget_ms = remaining * 1e3 if remaining is not None else None
            doc = await self.predict(request.model_name, req,
                                     version=request.model_version or None,
                                     budget_ms=budget_ms, start=start)
        except RedlineError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.grpc_status), exc.message)
        resp = v1.PredictResponse(  # type: ignore[attr-defined]
            model_name=doc["model_name"], model_version=doc["model_version"],
            request_id=doc.get("request_id", ""), path=doc["path"], degraded=doc["degraded"],
            degraded_reasons=doc["degraded_reasons"], timings_us=doc["timings_us"])
        for row in doc["predictions"] if req.batch else [doc]:
            value = row["prediction"]
            pred = resp.predictions.add(
                values=value if isinstance(value, list) else [value],
                entity_missing=row["entity_missing"])
            if "label" in row:
                pred.has_label = True
                pred.label = row["label"]
        if "session" in doc:
            s = doc["session"]
            resp.session.id = s["id"]
            resp.session.counters.update(s["counters"])
            resp.session.events = s["events"]
        return resp

    def close(self) -> None:
        """Release the online store's connections (at server shutdown)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        close = getattr(self.store, "close", None)
        if close is not None and getattr(self.store, "kind", "") != "memory":
            close()

    # ------------------------------------------------------------------ events (embedded ingest)
    def ingest(self, body: bytes) -> dict[str, Any]:
        """``POST /v1/events`` in-process (the features package's ingest handler does the work)."""
        from redline.features.ingest import parse_body

        res = self.ingestor.ingest(parse_body(body))
        return {"accepted": res.accepted, "rejected": len(res.rejected),
                "errors": [{"index": r.tag, "reason": r.reason} for r in res.rejected[:100]]}

    @property
    def ingestor(self) -> Any:
        """The features package's :class:`Ingestor` writing to this pipeline's store."""
        ingestor = getattr(self, "_ingestor", None)
        if ingestor is None:
            from redline.features.ingest import Ingestor

            ingestor = self._ingestor = Ingestor(self.defs, self.store)
        return ingestor

    # ------------------------------------------------------------------ the predict path
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
            if route.reader is not None and self._executor is not None:
                route.fetcher = FeatureFetcher(route.reader.read, self._executor,
                                               route.entity_names)
            # Forget routes of versions no longer loaded (a pinned version stays routed).
            loaded = {id(h) for h in self.registry.loaded(handle.name)}
            self._routes = {k: r for k, r in self._routes.items()
                            if k[0] != handle.name or k[2] in loaded}
            self._routes[key] = route
        return route

    def _is_default(self, handle: ModelHandle) -> bool:
        """Whether ``handle`` is the version served by default (its change drops caches)."""
        try:
            return self.registry.get(handle.name) is handle
        except RedlineError:
            return False

    def _fallback_handle(self, handle: ModelHandle) -> ModelHandle | None:
        name = self.settings.for_model(handle.name).fallback or handle.metadata.fallback
        if not name or name == handle.name:
            return None
        try:
            return self.registry.get(name)
        except RedlineError:
            return None

    async def predict(self, name: str, req: PredictRequest, *, version: str | None = None,
                      budget_ms: float | None = None, start: float | None = None
                      ) -> dict[str, Any]:
        """Serve one parsed request; the answer is a JSON-ready dict (see ``docs/pipeline.md``)."""
        start = now() if start is None else start
        stage = Stage(start, {}, [])
        handle = self.registry.get(name, version)
        deadline = start + (budget_ms if budget_ms is not None else handle.slo_ms) / 1000.0
        route = self.route(handle)
        n = len(req.entities)
        ids = self._entity_ids(route, req.entities, req.batch)
        fields = self._request_columns(route, req.fields, req.batch)
        stage.mark("parse")
        window = self._window(handle)
        feats, missing = await self._read_features(route, ids, n, stage, deadline, window)
        stage.mark("features")
        session = self._session(req, fields, stage) if req.session_id is not None else None
        if req.session_id is not None:
            stage.mark("session")
        # Which model: the primary unless the budget left is below its recent p99.
        plan: ModelPlan | None = route.primary
        path = PRIMARY
        if window.p99 and deadline - now() < window.p99:
            plan, path = self._cheaper(route, stage, "budget: "
                                       f"{max(0.0, deadline - now()) * 1e3:.2f} ms left < model "
                                       f"p99 {window.p99 * 1e3:.2f} ms")
        outputs: dict[str, np.ndarray] | None = None
        cached = 0
        if plan is not None:
            x = self._assemble(plan, route, feats, fields, session, n)
            stage.mark("transform")
            try:
                # A fallback is the last resort: it runs even if the budget is spent already.
                outputs, cached = await self._run(
                    plan, x, deadline if path == PRIMARY else None,
                    window if path == PRIMARY else None)
            except (Overloaded, DeadlineExceeded, ModelNotReady) as exc:
                if path != PRIMARY:
                    raise
                plan, path = self._cheaper(route, stage, f"primary refused: {exc.code}")
                if path == PRIMARY:
                    raise  # nothing cheaper configured: the refusal stands
                if plan is not None:
                    x = self._assemble(plan, route, feats, fields, session, n)
                    outputs, cached = await self._run(plan, x, None, None)
            if outputs is not None and cached == n and path == PRIMARY:
                path = CACHE
            stage.mark("model")
        self.paths[path] += 1
        if stage.reasons:
            self.degraded += 1
        stage.timings["total"] = int((now() - start) * 1e6)
        return self._answer(req, handle, plan, path, outputs, missing, session, stage, n)

    # ------------------------------------------------------------------ stages
    def _entity_ids(self, route: Route, rows: list[dict[str, Any]], batch: bool
                    ) -> dict[str, list[str]]:
        ids: dict[str, list[str]] = {e: [] for e in route.entity_names}
        for i, ent in enumerate(rows):
            seen = set()
            for key, value in ent.items():
                entity = route.keys.get(key)
                if entity is None:
                    known = sorted(k for k in route.keys if k not in route.entity_names) or \
                        ["(none: this model reads no entity features)"]
                    raise InvalidInput(
                        f"unknown entity key '{key}'{_at(i, batch)} for model "
                        f"'{route.primary.handle.name}'; it takes: {', '.join(known)}"
                    )
                if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
                    raise InvalidInput(f"entity key '{key}'{_at(i, batch)} must be a non-empty "
                                       f"string or integer id, got {value!r}")
                ids[entity].append(str(value))
                seen.add(entity)
            for entity in route.entity_names:
                if entity not in seen:
                    join = next(k for k, e in route.keys.items() if e == entity and k != entity)
                    raise InvalidInput(f"missing entity key '{join}'{_at(i, batch)}: model "
                                       f"'{route.primary.handle.name}' reads features of "
                                       f"entity '{entity}'")
        return ids

    @staticmethod
    def _request_columns(route: Route, rows: list[dict[str, Any]], batch: bool
                         ) -> dict[str, np.ndarray]:
        cols: dict[str, np.ndarray] = {}
        n = len(rows)
        for name in route.request_fields:
            col = np.empty(n, dtype=np.float64)
            for i, row in enumerate(rows):
                value = row.get(name, _ABSENT)
                if value is _ABSENT:
                    raise InvalidInput(f"missing required request field '{name}'{_at(i, batch)} "
                                       f"(model '{route.primary.handle.name}' needs: "
                                       f"{', '.join(route.request_fields)})")
                if value is None:
                    col[i] = math.nan
                elif isinstance(value, int | float):
                    col[i] = value
                else:
                    raise InvalidInput(f"request field '{name}'{_at(i, batch)} must be a number, "
                                       f"got {value!r}")
            cols[name] = col
        return cols

    async def _read_features(self, route: Route, ids: dict[str, list[str]], n: int,
                             stage: Stage, deadline: float, window: LatencyWindow
                             ) -> tuple[np.ndarray, np.ndarray]:
        """(n × features float32 in the route's column order, bool mask of missing entities)."""
        reader = route.reader
        if reader is None:
            return np.zeros((n, 0), np.float32), np.zeros(n, bool)
        near = self.near if self.near.enabled else None
        keys = [(route.cache_key, *(ids[e][r] for e in route.entity_names)) for r in range(n)]
        if near is not None:
            hits = [near.get(k) for k in keys]
            if all(h is not None for h in hits):
                return (np.stack([h[1] for h in hits]),  # type: ignore[index]
                        np.array([h[2] for h in hits], dtype=bool))  # type: ignore[index]
        if self.breaker.allow():
            try:
                if route.fetcher is None:
                    feats, missing = reader.read(ids)  # the embedded store: inline
                else:
                    feats, missing = await self._fetch(route.fetcher, ids, n, deadline, window)
            except _StoreSlow as exc:
                self.breaker.failure()
                reason = f"feature store slow (no answer within {exc.args[0] * 1e3:.1f} ms)"
            except Exception as exc:  # noqa: BLE001 - any store failure degrades, never a 500
                self.breaker.failure()
                reason = f"feature store unavailable ({type(exc).__name__})"
            else:
                self.breaker.success()
                if near is not None:
                    for r in range(n):
                        near.put(keys[r], feats[r], bool(missing[r]))
                return feats, missing
        else:
            reason = "feature store circuit open"
        # Degraded: near cache within the fallback staleness, else declared defaults.
        feats = np.tile(route.defaults, (n, 1))
        missing = np.zeros(n, dtype=bool)
        from_cache = 0
        oldest = 0.0
        for r in range(n):
            hit = near.get(keys[r], fallback=True) if near is not None else None
            if hit is not None:
                oldest = max(oldest, hit[0])
                feats[r] = hit[1]
                missing[r] = hit[2]
                from_cache += 1
        if from_cache == n:
            stage.reasons.append(f"{reason}: features from near cache, up to "
                                 f"{oldest * 1e3:.0f} ms old")
        elif from_cache:
            stage.reasons.append(f"{reason}: {from_cache} of {n} rows from near cache, the rest "
                                 "from declared defaults")
        else:
            stage.reasons.append(f"{reason}: features are the declared defaults")
        return feats, missing

    @staticmethod
    async def _fetch(fetcher: FeatureFetcher, ids: dict[str, list[str]], n: int,
                     deadline: float, window: LatencyWindow) -> tuple[np.ndarray, np.ndarray]:
        """The coalesced read, waited for no longer than the budget leaves after the model."""
        # The model's recent p99, plus the event loop's timer resolution (uvloop: 1 ms) and ~1 ms
        # for assembly and the answer, so a cut-short wait still answers by the deadline.
        reserve = window.p99 + 0.002
        wait = max(0.0005, deadline - now() - reserve)
        future = fetcher.read(ids, n)
        timer = asyncio.get_running_loop().call_later(wait, _expire, future, wait)
        try:
            return await future
        finally:
            timer.cancel()

    def _session(self, req: PredictRequest, fields: dict[str, np.ndarray], stage: Stage
                 ) -> SessionState | None:
        assert req.session_id is not None
        increments: dict[str, float] = {"requests": float(len(req.fields))}
        for name, col in fields.items():
            finite = col[np.isfinite(col)]
            increments[f"{name}_sum"] = float(finite.sum())
        event = orjson.dumps(req.fields[-1]) if req.fields else None
        store_backed = getattr(self.sessions, "kind", "") == "redis"
        if store_backed and not self.breaker.allow():
            stage.reasons.append("session store circuit open: session state not updated")
            return None
        try:
            state = self.sessions.update(req.session_id, increments, event)
        except Exception as exc:  # noqa: BLE001 - degrade: answer without session state
            if store_backed:
                self.breaker.failure()
            stage.reasons.append(f"session store unavailable ({type(exc).__name__}): session "
                                 "state not updated")
            return None
        if store_backed:
            self.breaker.success()
        return state

    def _cheaper(self, route: Route, stage: Stage, why: str) -> tuple[ModelPlan | None, str]:
        if route.fallback is not None:
            stage.reasons.append(f"{why}: served by fallback model "
                                 f"'{route.fallback.handle.name}'")
            return route.fallback, FALLBACK
        if self.settings.for_model(route.primary.handle.name).default_answer is not None:
            stage.reasons.append(f"{why}: served the configured default answer")
            return None, DEFAULT
        return route.primary, PRIMARY  # nothing cheaper configured: try the primary anyway

    @staticmethod
    def _assemble(plan: ModelPlan, route: Route, feats: np.ndarray, fields: dict[str, np.ndarray],
                  session: SessionState | None, n: int) -> np.ndarray:
        x = np.empty((n, plan.width), dtype=plan.dtype)
        col = route.col
        for j, (kind, what) in enumerate(plan.columns):
            if kind == "feature":
                x[:, j] = feats[:, col[what]]
            elif kind == "request":
                x[:, j] = fields[what]
            elif kind == "transform":
                args = [fields[f] for f in what.request]
                args += [feats[:, col[ref]].astype(np.float64) for ref in what.features]
                x[:, j] = what.compute(args) if args else what.default
            else:  # session counter; 0 when there is no session (or its store is down)
                x[:, j] = session.counters.get(what, 0.0) if session is not None else 0.0
        return x

    async def _run(self, plan: ModelPlan, x: np.ndarray, deadline: float | None,
                   window: LatencyWindow | None) -> tuple[dict[str, np.ndarray], int]:
        """Outputs for every row (cached rows from the prediction cache) and how many hit it."""
        handle = plan.handle
        cache = self.predictions if self.predictions.enabled else None
        if cache is None:
            t0 = now()
            out = await handle.infer({plan.input_name: x}, deadline)
            if window is not None:
                window.add(now() - t0)
            return out, 0
        rows = [x[r].tobytes() for r in range(x.shape[0])]
        hits = [cache.get(handle.name, handle.version, b) for b in rows]
        todo = [r for r, h in enumerate(hits) if h is None]
        if todo:
            t0 = now()
            ran = await handle.infer({plan.input_name: x[todo]}, deadline)
            if window is not None:
                window.add(now() - t0)
            for k, r in enumerate(todo):
                row_out = {name: v[k:k + 1] for name, v in ran.items()}
                cache.put(handle.name, handle.version, rows[r], row_out)
                hits[r] = row_out
        out = {name: np.concatenate([h[name] for h in hits])  # type: ignore[index]
               for name in handle.output_names}
        return out, x.shape[0] - len(todo)

    def _window(self, handle: ModelHandle) -> LatencyWindow:
        key = (handle.name, handle.version)
        w = self._latency.get(key)
        if w is None:
            w = self._latency[key] = LatencyWindow(self.settings.pipeline.latency_window)
        return w

    # ------------------------------------------------------------------ the answer
    def _answer(self, req: PredictRequest, handle: ModelHandle, plan: ModelPlan | None,
                path: str, outputs: dict[str, np.ndarray] | None, missing: np.ndarray,
                session: SessionState | None, stage: Stage, n: int) -> dict[str, Any]:
        served = plan.handle if plan is not None else handle
        if outputs is not None and plan is not None:
            preds = _predictions(plan, outputs, n)
        else:
            answer = self.settings.for_model(handle.name).default_answer or []
            value: Any = answer[0] if len(answer) == 1 else list(answer)
            preds = [{"prediction": value} for _ in range(n)]
        for r in range(n):
            preds[r]["entity_missing"] = bool(missing[r])
        doc: dict[str, Any] = {
            "model_name": served.name,
            "model_version": served.version_str,
            "path": path,
            "degraded": bool(stage.reasons),
            "degraded_reasons": stage.reasons,
        }
        if req.request_id is not None:
            doc["request_id"] = req.request_id
        if req.batch:
            doc["predictions"] = preds
        else:
            doc.update(preds[0])
        if session is not None:
            doc["session"] = session.to_dict()
        doc["timings_us"] = stage.timings
        return doc


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


_ABSENT = object()


class _StoreSlow(Exception):
    """The store did not answer within what the request's budget allowed (seconds in args)."""


def _expire(future: asyncio.Future[Any], wait: float) -> None:
    if not future.done():
        future.set_exception(_StoreSlow(wait))


def _at(i: int, batch: bool) -> str:
    return f" in instances[{i}]" if batch else ""


def open_store(settings: Settings, defs: Any) -> Any:
    """The online store ``features.store`` names (memory: embedded; redis: shared)."""
    from redline.features.online import open_online_store

    store = open_online_store(settings.features)
    client = getattr(store, "client", None)
    if client is not None and hasattr(client, "set_retry"):
        # No retries on the request path (redis-py retries a refused connection with backoff:
        # 6 ms instead of 1 ms per request, measured): a failed read degrades at once and the
        # circuit breaker decides when to try the store again.
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        client.set_retry(Retry(NoBackoff(), 0))
    register = getattr(store, "register", None)
    if register is not None and defs is not None:
        register(list(defs.views.values()))
    return store


def _default_sessions(store: Any, settings: Settings) -> SessionStore:
    cfg = settings.pipeline
    client = getattr(store, "client", None)
    if getattr(store, "kind", None) == "redis" and client is not None:
        return RedisSessionStore(client, getattr(store, "url", ""), cfg.session_ttl_s,
                                 cfg.session_max_events)
    return MemorySessionStore(cfg.session_ttl_s, cfg.session_max_events)


def feature_columns(route: Route) -> Sequence[str]:
    """The online feature refs a route reads, in column order (for tests and docs)."""
    return list(route.col)
