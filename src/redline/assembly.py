"""A server with what attaches to it: where serving and monitoring meet, above both.

Serving offers a place for its monitoring (``RedlineServer``'s ``monitoring``: request
observers, routes, a companion) and imports neither monitoring nor scaling; monitoring fills it
and imports serving's types. This module builds a :class:`RedlineServer`, with monitoring's
``ServerMonitor`` when ``monitoring.enabled``; every process that serves (``redline serve``, a
worker, the demo) is built here.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

from redline.config import Settings
from redline.errors import InvalidInput
from redline.models import ModelRepository
from redline.serving.server import RedlineServer


def build_server(settings: Settings, repository: ModelRepository | None = None) -> RedlineServer:
    """A server for ``settings``, monitored when ``monitoring.enabled``."""
    if not settings.monitoring.enabled:
        return RedlineServer(settings, repository)
    from redline.monitoring import ServerMonitor

    return RedlineServer(settings, repository, monitoring=ServerMonitor)


def run(settings: Settings, repository: ModelRepository | None = None) -> None:
    """Block serving until SIGTERM/SIGINT."""
    import uvloop

    uvloop.run(build_server(settings, repository).serve())


def preload_store(server: RedlineServer, path: str) -> None:
    """Replay an event file into the server's own online store before it opens its ports."""
    from redline.features.ingest import replay_file

    if not Path(path).is_file():
        raise InvalidInput(f"features.preload file {path} does not exist")
    pipeline = server.pipeline
    if pipeline.defs is None:
        raise InvalidInput("--preload needs feature definitions (features.definitions or "
                           "--definitions)")
    phases = server.phases
    phases.done("monitoring attached, ports claimed, rollouts installed")
    started = time.perf_counter()
    cpu_started = time.process_time()
    # The replay builds the store's whole state, objects that live as long as the process: the
    # cyclic collector's passes over the growing heap cost a third of the replay and a full
    # collection at the end a second more, so it is off meanwhile and the result frozen out of
    # its reach (the replay makes no reference cycles to collect).
    from redline.serving.store_wait import patient, wait_for_store

    target = pipeline.ingestor.store
    wait_for_store(target)  # a Redis not up yet, or slow on a loaded machine, is waited for
    gc.disable()
    try:
        with patient(target):
            result = replay_file(pipeline.ingestor, path)
    finally:
        gc.freeze()
        gc.enable()
    seconds = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started  # the rate a quiet machine would see
    store = server.settings.features.store
    detail = (f"{result.accepted} events from {path} into the {store} store, "
              f"{result.accepted / max(seconds, 1e-9):,.0f} events/s, "
              f"{result.accepted / max(cpu_s, 1e-9):,.0f} per CPU-second, "
              f"{len(result.rejected)} dead letters")
    phases.done("preload", detail)
