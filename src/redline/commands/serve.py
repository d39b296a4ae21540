"""``redline serve``: the repository as an Open Inference Protocol v2 service (REST + gRPC)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from redline.commands._common import config_option, repository_option, store_options
from redline.config import apply_serve_options, load_settings
from redline.errors import ConfigError

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
    from redline.assembly import build_server, preload_store

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


