"""The V2 routes beside inference: server and model metadata, health, statistics, and the
repository's admin routes (``load``, ``unload``, ``index``), mounted on the REST app.

Readiness is the models' (``ModelRegistry.readiness``) and the drain's; what else the server
knows about its health (the online store's reachability, ``serving/store_health.py``) comes in
as :class:`HealthDetails` and is added to the ``/v2/health/ready`` body, never to the verdict.
"""

from __future__ import annotations

from typing import Any, Protocol

from redline import __version__
from redline.config import Settings
from redline.errors import ModelNotReady, NotFound
from redline.serving.app import HttpRequest, HttpResponse, RestApp
from redline.serving.metadata import EXTENSIONS, model_metadata, triton_config
from redline.serving.registry import ModelRegistry


class HealthDetails(Protocol):
    """Fields for the ``/v2/health/ready`` body beside the verdict (``StoreHealth``)."""

    def body(self) -> dict[str, Any]: ...


class V2Routes:
    """The V2 REST handlers other than inference. ``draining`` turns readiness off during
    shutdown."""

    def __init__(self, registry: ModelRegistry, settings: Settings,
                 health: HealthDetails | None = None) -> None:
        self.registry = registry
        self.settings = settings
        self.health = health
        self.draining = False

    def install(self, app: RestApp) -> None:
        add = app.add_route
        add("GET", "/v2", self.server_metadata)
        add("GET", "/v2/health/live", self.live)
        add("GET", "/v2/health/ready", self.ready)
        for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            add("GET", prefix, self.model_metadata)
            add("GET", prefix + "/ready", self.model_ready)
            add("GET", prefix + "/config", self.model_config)
            add("GET", prefix + "/stats", self.model_stats)
            # Answered by the app's infer path before any route is matched; listed here for
            # the OpenAPI document and the 405 of another method.
            add("POST", prefix + "/infer", self._infer_elsewhere)
        add("POST", "/v2/repository/index", self.repository_index, admin=True)
        add("POST", "/v2/repository/models/{name}/load", self.repository_load, admin=True)
        add("POST", "/v2/repository/models/{name}/unload", self.repository_unload, admin=True)

    async def _infer_elsewhere(self, request: HttpRequest) -> HttpResponse:
        raise NotFound(f"no route for POST {request.path}")  # unreachable (see install)

    async def server_metadata(self, request: HttpRequest) -> HttpResponse:
        extensions = list(EXTENSIONS)
        if self.settings.server.admin_enabled:
            extensions.append("model_repository")
        return HttpResponse.json({"name": "redline", "version": __version__,
                                  "extensions": extensions})

    async def live(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({"live": True})

    async def ready(self, request: HttpRequest) -> HttpResponse:
        models_ready, not_ready = self.registry.readiness()
        ready = not self.draining and models_ready
        doc: dict[str, Any] = {"ready": ready}
        if not_ready:  # each model that does not serve, why, and what to do
            doc["models_not_ready"] = not_ready
        if self.draining:
            doc["reason"] = "draining: the server is shutting down"
        if fallbacks := self.registry.provider_fallbacks():  # asked for a GPU, serving on CPU
            doc["provider_fallback"] = fallbacks
        if self.health is not None:
            doc.update(self.health.body())
        return HttpResponse.json(doc, 200 if ready else 503)

    async def model_metadata(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(model_metadata(self.registry, request.params))

    async def model_ready(self, request: HttpRequest) -> HttpResponse:
        name, version = request.params["name"], request.params.get("version")
        try:
            self.registry.get(name, version)
        except ModelNotReady as exc:  # known but not loaded: 503; unknown: 404 (raised)
            return HttpResponse.json({"name": name, "ready": False, "error": exc.message}, 503)
        if self.draining:
            return HttpResponse.json({"name": name, "ready": False, "error": "draining"}, 503)
        return HttpResponse.json({"name": name, "ready": True})

    async def model_config(self, request: HttpRequest) -> HttpResponse:
        handle = self.registry.get(request.params["name"], request.params.get("version"))
        return HttpResponse.json(triton_config(handle))

    async def model_stats(self, request: HttpRequest) -> HttpResponse:
        handle = self.registry.get(request.params["name"], request.params.get("version"))
        return HttpResponse.json({"name": handle.name, "version": handle.version_str,
                                  "queued": handle.batcher.queued,
                                  "batch_cap": handle.batcher.cap, **handle.stats.as_dict()})

    async def repository_index(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(self.registry.index())

    async def repository_load(self, request: HttpRequest) -> HttpResponse:
        await self.registry.load(request.params["name"])
        return HttpResponse.json({"name": request.params["name"], "loaded": True})

    async def repository_unload(self, request: HttpRequest) -> HttpResponse:
        await self.registry.unload(request.params["name"])
        return HttpResponse.json({"name": request.params["name"], "unloaded": True})
