"""``redline serve``: the repository as an Open Inference Protocol v2 service (REST + gRPC)."""

from __future__ import annotations

import gc
import logging
import os
import time
from pathlib import Path

import click

from redline.commands._common import config_option, repository_option, store_options
from redline.config import Settings, load_settings
from redline.errors import ConfigError, InvalidInput

PORT_RANGE = click.IntRange(0, 65535)  # a port out of range is a usage error, not a traceback
log = logging.getLogger("redline.serving")


@click.command("serve")
@config_option
@repository_option
@click.option("--host", default=None,
              help="Address to bind (default: server.host, 127.0.0.1; 0.0.0.0 = every address).")
@click.option("--http-port", type=PORT_RANGE, default=None,
              help="REST port (default 8000; 0 = any).")
@click.option("--grpc-port", type=PORT_RANGE, default=None,
              help="gRPC port (default 8001; 0 = any).")
@click.option("--no-grpc", is_flag=True, help="Serve REST only.")
@click.option("--no-watch", is_flag=True, help="Do not poll the repository for new versions.")
@store_options
@click.option("--definitions", "-d", default=None, metavar="FILE",
              help="Feature definitions for /v1 entity predictions (default: "
                   "features.definitions).")
@click.option("--preload", default=None, metavar="FILE",
              help="Replay this event file (.jsonl/.csv/.parquet) into the online store before "
                   "serving (default: features.preload) - how the embedded memory store starts "
                   "with history.")
@click.option("--admin-token", envvar="REDLINE_ADMIN_TOKEN", default=None,
              help="Enable the admin API (load/unload/index) behind this bearer token.")
@click.option("--workers", type=int, default=None, metavar="N",
              help="Worker processes sharing the ports, each with its own models (default: "
                   "scaling.workers; 0 = one per core, or 1 with the in-memory store).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]),
              help="Startup, model loads and swaps are logged at info; requests never are.")
def serve(config_path: str | None, repository: str | None, host: str | None,
          http_port: int | None, grpc_port: int | None, no_grpc: bool, no_watch: bool,
          store: str | None, redis_url: str | None, definitions: str | None,
          preload: str | None, admin_token: str | None, workers: int | None,
          log_level: str) -> None:
    """Serve every model in the repository over HTTP and gRPC until SIGTERM (then drain).

    Settings come from redline.yaml (--config), then REDLINE_<SECTION>__<KEY> environment
    variables, then these options.

    \b
    Examples:
      redline serve                                        # REST :8000, gRPC :8001
      redline serve --config .redline/demo/redline.yaml    # what `make demo` built
      redline serve --http-port 0 --grpc-port 0            # any free ports (logged)
      redline serve --config redline.yaml --redis-url redis://127.0.0.1:6390/0
      redline serve --no-grpc --no-watch --admin-token "$TOKEN"
      redline serve --workers 2 --redis-url redis://127.0.0.1:6379/0   # 2 processes, 1 port
    """
    settings = load_settings(config_path)
    limit_math_threads(settings.runtime.intra_op_threads)
    options = dict(repository=repository, host=host, http_port=http_port, grpc_port=grpc_port,
                   no_grpc=no_grpc, no_watch=no_watch, store=store, redis_url=redis_url,
                   definitions=definitions, preload=preload, admin_token=admin_token)
    apply_serve_options(settings, **options)  # type: ignore[arg-type]
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    from redline.scaling.workers import resolve_workers, run_supervised

    count = resolve_workers(settings, workers)
    check_repository(settings.repository)

    def warn_when_empty() -> None:
        warn_if_empty(settings.repository, watched=settings.server.watch_repository)

    if count > 1 or settings.scaling.max_workers > 1:
        run_supervised(settings, {"config": config_path, "options": options,
                                  "log_level": log_level}, count, ports_claimed=warn_when_empty)
        return
    from redline.assembly import build_server

    server = build_server(settings)
    server.claim_ports()  # a port in use is one line now, not after the preload and the models
    warn_when_empty()
    from redline.scaling.rollout import install

    install(server)  # canary/shadow rollouts (redline rollout start)
    if settings.features.preload:
        preload_store(server, settings.features.preload)
    import uvloop

    uvloop.run(server.serve())


MATH_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def limit_math_threads(threads: int) -> None:
    """numpy's BLAS and faiss's OpenMP get the threads ONNX Runtime gets (runtime.intra_op_threads).

    A server runs requests side by side; a retrieval's matrix product that also fans out over
    every core makes its threads spin against the event loop and the other requests, and on a
    busy machine the exact search's p50 went from 1 ms to 3-5 ms. The libraries read these
    variables once, when numpy loads, so this runs before anything imports it; a variable the
    operator set wins, and 0 (every core) leaves them alone. Worker processes inherit them.
    """
    if threads < 1:
        return
    for name in MATH_THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))


def apply_serve_options(settings: Settings, *, repository: str | None = None,
                        host: str | None = None, http_port: int | None = None,
                        grpc_port: int | None = None, no_grpc: bool = False,
                        no_watch: bool = False, store: str | None = None,
                        redis_url: str | None = None, definitions: str | None = None,
                        preload: str | None = None, admin_token: str | None = None) -> None:
    """Command-line options win over the file and the environment."""
    server = settings.server
    if repository is not None:
        settings.repository = repository
    if host is not None:
        server.host = host
    if http_port is not None:
        server.http_port = http_port
    if grpc_port is not None:
        server.grpc_port = grpc_port
    if no_grpc:
        server.grpc_enabled = False
    if no_watch:
        server.watch_repository = False
    if store:
        settings.features.store = store
    if redis_url:
        settings.features.redis_url = redis_url
        settings.features.store = store or "redis"
    if definitions:
        settings.features.definitions = definitions
    if preload:
        settings.features.preload = preload
    if admin_token:
        server.admin_enabled = True
        server.admin_token = admin_token


def check_repository(path: str) -> None:
    """A model repository that is not there is a mistyped path: refused before anything."""
    root = Path(path)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise ConfigError(
            f"model repository {path} {what}; name the folder that holds <model>/<version>/ "
            "with --repository (or `repository:` in redline.yaml), or create it and add a "
            "model with `redline models add`")


def warn_if_empty(path: str, *, watched: bool) -> None:
    """A repository with no model yet is a project whose first model is still to come: the
    server starts, and says so."""
    from redline.models import ModelRepository

    if not ModelRepository(path).list_models():
        then = ("it is watched: a model added there is served within seconds" if watched
                else "with --no-watch, add one with `redline models add` and restart")
        log.warning("model repository %s has no model yet; serving none until one is added "
                    "(%s)", path, then)


def preload_store(server: object, path: str) -> None:
    """Replay an event file into the server's own online store before it opens its ports."""
    from redline.features.ingest import replay_file

    if not Path(path).is_file():
        raise InvalidInput(f"features.preload file {path} does not exist")
    pipeline = getattr(server, "pipeline", None)
    if pipeline is None or getattr(pipeline, "defs", None) is None:
        raise InvalidInput("--preload needs feature definitions (features.definitions or "
                           "--definitions)")
    phases = getattr(server, "phases", None)
    if phases is not None:
        phases.done("monitoring attached, ports claimed, rollouts installed")
    started = time.perf_counter()
    cpu_started = time.process_time()
    # The replay builds the store's whole state, objects that live as long as the process: the
    # cyclic collector's passes over the growing heap cost a third of the replay and a full
    # collection at the end a second more, so it is off meanwhile and the result frozen out of
    # its reach (the replay makes no reference cycles to collect).
    from redline.serving.store_wait import patient, wait_for_store

    target = getattr(pipeline.ingestor, "store", None) or getattr(pipeline, "store", None)
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
    store = server.settings.features.store  # type: ignore[attr-defined]
    detail = (f"{result.accepted} events from {path} into the {store} store, "
              f"{result.accepted / max(seconds, 1e-9):,.0f} events/s, "
              f"{result.accepted / max(cpu_s, 1e-9):,.0f} per CPU-second, "
              f"{len(result.rejected)} dead letters")
    if phases is not None:
        phases.done("preload", detail)
    else:
        logging.getLogger("redline.serving").info("preloaded %s", detail)
