"""One process, one event loop: uvicorn (httptools, uvloop) for REST and grpc.aio for gRPC.

Shutdown on SIGTERM or SIGINT is a drain: readiness turns false (load balancers stop sending),
the listeners close, in-flight requests on both transports finish (up to
``server.drain_timeout_s``), model batchers empty, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import uvicorn

from redline.config import Settings
from redline.errors import ConfigError
from redline.models import ModelRepository
from redline.serving.app import RestApp
from redline.serving.grpc import InferenceServicer, create_grpc_server
from redline.serving.http_protocol import HttpLimits, RedlineHttpProtocol
from redline.serving.observers import Observers, RequestObserver
from redline.serving.predict import (
    PredictPipeline,
    VersionChecks,
    build_pipeline,
    open_features,
)
from redline.serving.registry import ModelRegistry
from redline.serving.startup import StartupPhases
from redline.serving.store_health import StoreHealth
from redline.serving.tfserving import TfServingRest
from redline.serving.v1_grpc import V1Grpc
from redline.serving.v1_rest import V1Rest
from redline.serving.v2_routes import V2Routes
from redline.serving.warmup import warm_request_path

log = logging.getLogger("redline.serving")


class Listener(Protocol):
    """What accepts a server's HTTP connections in place of the event loop's own server
    (a pool's worker: ``scaling/accept.py``), as uvicorn closes its servers."""

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


# listen_with(socket, protocol class, its keyword arguments, uvicorn's open connections)
ListenWith = Callable[[socket.socket, type, dict[str, Any], set[Any]], Listener]


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the RedlineServer owns shutdown. With
    ``listen_with``, its HTTP connections are accepted by that listener, not the loop's."""

    listen_with: ListenWith | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        listen_with = self.listen_with
        if listen_with is None or not sockets:
            await super().startup(sockets)
            return
        await super().startup(sockets=[])  # all of uvicorn's start but its listener
        kwargs = {"config": self.config, "server_state": self.server_state,
                  "app_state": self.lifespan.state}
        protocol = self.config.http_protocol_class
        for sock in sockets:
            self.servers.append(listen_with(sock, protocol, kwargs,  # type: ignore[arg-type]
                                            self.server_state.connections))


class ServerCompanion(Protocol):
    """Something that lives with a server (its monitoring): ``models_loaded`` once the models
    are loaded, before the warm-up and the ports; ``run`` as a task while the server serves
    (cancelled when it drains); ``close`` after the drain."""

    async def models_loaded(self) -> None: ...

    async def run(self) -> None: ...

    def close(self) -> None: ...


class ServerMonitoring(ServerCompanion, Protocol):
    """A server's monitoring, as the server sees it: the observers it adds to the server's
    (every finished request), the routes it mounts on the REST app, and a companion's life."""

    def observers(self) -> Sequence[RequestObserver]: ...

    def install(self, app: RestApp) -> None: ...


# Builds a server's monitoring from what it watches (``monitoring.ServerMonitor``).
MonitoringFactory = Callable[[Settings, ModelRegistry, PredictPipeline], ServerMonitoring]


class RedlineServer:
    """Owns the registry, both transports and the repository watcher.

    Its monitoring comes in through the constructor (``monitoring``, which builds a
    :class:`ServerMonitoring`; ``redline.assembly`` passes monitoring's ``ServerMonitor``).
    Extension points, for packages that add to the server before ``serve()`` (a rollout):
    ``observers`` (an :class:`Observers`: ``observers.add(obj)`` and ``obj.request_finished``
    gets every request's :class:`RequestRecord`, V2 and ``/v1``, REST and gRPC),
    ``app.add_route(method, template, handler)`` for more REST routes, and
    ``attach(companion)`` for what lives as long as the server (:class:`ServerCompanion`).
    Serving imports none of them.
    """

    def __init__(self, settings: Settings, repository: ModelRepository | None = None,
                 observers: Observers | None = None,
                 monitoring: MonitoringFactory | None = None) -> None:
        self.phases = StartupPhases()  # each start-up phase logged with its time
        self.phases.done("imports and settings", quiet_until_next=True)
        self.settings = settings
        self.repository = repository or ModelRepository(settings.repository)
        # Entity predictions (/v1 REST routes and the redline.v1 gRPC service): their feature
        # definitions and online store, checked against each version as it loads (not per
        # request), and the pipeline over them.
        definitions, store = open_features(settings)
        checks = VersionChecks(settings, definitions, store, self.repository)
        self.registry = ModelRegistry(self.repository, settings, checks)
        self.observers = observers if observers is not None else Observers()
        self.pipeline = build_pipeline(self.registry, settings, definitions, store, checks)
        # The online store's reachability: logged at start and on every change, and added to
        # the readiness body.
        self.store_health = StoreHealth(self.pipeline.store, settings.features.redis_url,
                                        entity_loss=self.pipeline.entity_loss)
        self.app = RestApp(self.registry, settings, self.observers)
        self.v2_routes = V2Routes(self.registry, settings, self.store_health)
        self.v2_routes.install(self.app)
        V1Rest(self.pipeline, self.app).install(self.app)
        # TF Serving's REST API and KServe V1 (`name:predict`), over the same handles.
        TfServingRest(self.registry, self.pipeline, self.app).install(self.app)
        self.servicer = InferenceServicer(self.registry, settings, self.observers)
        self._v1_grpc = V1Grpc(self.pipeline, self.observers)
        self.companions: list[ServerCompanion] = []
        # The server's monitoring, when it has one (``redline.assembly``): metrics, traces,
        # drift, quality, review, alerts, /metrics and /dashboard. Its observers see every
        # request, its routes join the app, and it lives as long as the server.
        self.monitor = (monitoring(settings, self.registry, self.pipeline)
                        if monitoring is not None else None)
        if self.monitor is not None:
            for observer in self.monitor.observers():
                self.observers.add(observer)
            self.monitor.install(self.app)
            self.attach(self.monitor)
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.started = asyncio.Event()
        self._stop = asyncio.Event()
        self._http: _Uvicorn | None = None
        # Set by a worker process (scaling/worker.py): the listening socket it shares with its
        # siblings, and the ASGI app uvicorn runs (the REST app, possibly wrapped by a meter).
        self.http_socket: socket.socket | None = None
        # How a pool's worker accepts from that shared socket (None: the event loop's server).
        self.listen_with: ListenWith | None = None
        self.asgi: Any = self.app
        self.grpc_interceptors: list[Any] = []  # e.g. the worker's load meter
        self._listen: socket.socket | None = None  # the HTTP port, taken by claim_ports()
        self._claimed = False
        self.phases.done("server built", "feature definitions, online store",
                         quiet_until_next=True)

    def attach(self, companion: ServerCompanion) -> None:
        """Start, run and close ``companion`` with this server (before ``serve()``)."""
        self.companions.append(companion)

    def claim_ports(self) -> None:
        """Take the HTTP port and check the gRPC one, before anything slow: a port in use is
        one clear ``ConfigError`` at once, not after the models load. ``serve()`` calls it
        when nobody did earlier (``redline serve`` does, before the store's preload)."""
        if self._claimed:
            return
        server = self.settings.server
        if self.http_socket is None:  # else a worker: its supervisor claimed both ports
            self._listen = _bind(server.host, server.http_port)
            if server.grpc_enabled:
                _probe_grpc(server.host, server.grpc_port)
        self._claimed = True

    async def serve(self, install_signals: bool = True) -> None:
        """Load models, serve until ``stop()`` or a signal, then drain."""
        server = self.settings.server
        self.claim_ports()
        await self.registry.sync()
        for companion in self.companions:
            # Before the ports open; nothing slow (monitoring's drift thresholds are read from
            # beside each version, or calibrated in the background once the ports are open).
            await companion.models_loaded()
        self.phases.done("models loaded and warm", f"{len(self.registry.models())} models")
        store_health = self.store_health
        await store_health.check()
        self.phases.done("online store checked")
        # A value beyond a float's range becomes inf and is refused by the finite-value check
        # with a clear 400; numpy's own RuntimeWarning for it would only add noise to stderr.
        np.seterr(over="ignore", invalid="ignore")
        # The first request after ready costs what the hundredth does: the whole path is run
        # now, before the ports open (so no readiness probe sees the server ready while it
        # runs), on stand-ins that leave no trace (serving/warmup.py).
        # (the server's protocol: the limits on header size, count, time and connections)
        protocol = RedlineHttpProtocol.limited(HttpLimits.of(server))
        await warm_request_path(self.registry, self.pipeline, self.settings,
                                bool(self.observers), protocol)
        self.phases.done("request path warm")
        # What startup made (modules, models, settings) lives as long as the process: freeze it
        # out of the collector so a full collection costs microseconds instead of stalling every
        # in-flight request for milliseconds (benchmarks/pipeline/gc_probe, gc_summary.py).
        gc.collect()
        gc.freeze()
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        sock = self.http_socket or self._listen
        assert sock is not None  # (claim_ports bound it)
        self.http_port = sock.getsockname()[1]
        grpc_server = None
        if server.grpc_enabled:
            grpc_server = create_grpc_server(self.servicer, self.settings,
                                             self._v1_grpc.handlers(),
                                             reuse_port=self.http_socket is not None,
                                             interceptors=self.grpc_interceptors)
            try:
                self.grpc_port = grpc_server.add_insecure_port(
                    f"{server.host}:{server.grpc_port}")
            except RuntimeError:
                raise ConfigError(
                    f"cannot listen for gRPC on {server.host}:{server.grpc_port}: the port is in "
                    "use or the address is not this machine's; choose another --grpc-port "
                    "(0 = any free port) or --no-grpc"
                ) from None
            await grpc_server.start()
        config = uvicorn.Config(
            self.asgi, host=server.host, port=server.http_port, http=protocol,
            loop="none",
            lifespan="off", access_log=False, log_level="warning", proxy_headers=False,
            # uvicorn's own logging config would close every handler the process already has
            # (dictConfig), an embedder's included: its loggers propagate to the root instead.
            log_config=None,
            server_header=False,
            timeout_graceful_shutdown=int(max(1, server.drain_timeout_s)),
            # (the protocol enforces server.keep_alive_timeout_s itself; uvicorn's is unused)
            timeout_keep_alive=max(1, round(server.keep_alive_timeout_s)),
        )
        self._http = _Uvicorn(config)
        self._http.listen_with = self.listen_with
        http_task = loop.create_task(self._http.serve(sockets=[sock]))
        while not self._http.started and not http_task.done():
            await asyncio.sleep(0.01)
        if http_task.done():
            http_task.result()
        watcher = None
        if server.watch_repository:
            watcher = loop.create_task(self.registry.watch(server.watch_interval_s))
        store_watch = loop.create_task(store_health.watch()) if store_health.remote else None
        grpc_text = f"{server.host}:{self.grpc_port}" if grpc_server is not None else "off"
        log.info("redline serving %s models: http %s:%s grpc %s", len(self.registry.models()),
                 server.host, self.http_port, grpc_text)
        running = [loop.create_task(companion.run()) for companion in self.companions]
        self.phases.done("listening")
        self.phases.ready()
        self.started.set()
        await self._stop.wait()
        for task in running:
            task.cancel()
        # Drain: not ready, close listeners, finish in-flight work.
        self.v2_routes.draining = self.servicer.draining = True
        if server.drain_grace_s > 0:
            # Keep accepting while readiness reads false, so a load balancer's health check
            # takes this replica out before its listeners close (deploy/haproxy).
            await asyncio.sleep(server.drain_grace_s)
        if watcher is not None:
            watcher.cancel()
        if store_watch is not None:
            store_watch.cancel()
        self._http.should_exit = True
        waits: list[Any] = [http_task]
        if grpc_server is not None:
            waits.append(grpc_server.stop(server.drain_timeout_s))
        await asyncio.gather(*waits, return_exceptions=True)
        await self.registry.close()
        self.pipeline.close()
        for companion in self.companions:
            companion.close()
        log.info("redline stopped after draining")

    def stop(self) -> None:
        self._stop.set()


def _bind(host: str, port: int) -> socket.socket:
    """The HTTP listening socket, bound here so a taken port is a clear error, not an exit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn writes a response's head and body separately: without TCP_NODELAY (inherited by
    # accepted connections) Nagle holds the body until the client's delayed ACK, ~40 ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen for HTTP on {host}:{port}: {exc.strerror}; choose another "
            "--http-port (0 = any free port)"
        ) from None
    # Listening now, not when uvicorn starts: a socket only bound (SO_REUSEADDR) lets another
    # bind the same port, and gRPC on HTTP's port then took a random share of its connections.
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _probe_grpc(host: str, port: int) -> None:
    """Refuse a gRPC port another socket listens on (this server's HTTP port included), the
    way binding it later would, but now. Port 0 is any free port: nothing to check."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as gRPC binds here: a port left in TIME_WAIT is free, one with a listener is not, and
        # neither is one that a pool of workers shares (SO_REUSEPORT): this server would join it
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen for gRPC on {host}:{port}: {exc.strerror}; choose another "
                "--grpc-port (0 = any free port) or --no-grpc") from None
