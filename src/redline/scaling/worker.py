"""One worker process of ``redline serve --workers N`` (started by ``scaling/workers.py``).

It rebuilds the settings exactly as the command did (same file, same options, same environment),
takes the shared HTTP socket by descriptor, binds gRPC with SO_REUSEPORT, and serves until
SIGTERM, then drains like a single server does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from typing import Any

from redline.errors import RedlineError


async def _serve(server: object, board: object, slot: int) -> None:
    from redline.scaling.loadmeter import LoadBoard
    from redline.serving.server import RedlineServer

    assert isinstance(server, RedlineServer) and isinstance(board, LoadBoard)
    task = asyncio.get_running_loop().create_task(server.serve())
    started = asyncio.ensure_future(server.started.wait())
    await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
    if server.started.is_set():
        board.write(slot, 0, 0, 0, os.getpid())  # up: the supervisor may count on this worker
    await task


def main() -> None:
    """Entry point of a worker started as its own interpreter (``python -m``)."""
    run(json.loads(os.environ["REDLINE_WORKER"]))


def run(spec: dict[str, Any]) -> None:
    """Serve as the worker ``spec`` describes until SIGTERM (exits 2 on a user error)."""
    logging.basicConfig(level=spec.get("log_level", "info").upper(), force=True,
                        format=f"%(asctime)s %(levelname)s [worker {spec['slot']}] %(message)s")
    try:
        from redline.assembly import build_server, preload_store
        from redline.config import apply_serve_options, load_settings
        from redline.scaling.loadmeter import AsgiMeter, GrpcMeter, LoadBoard, LoadMeter

        settings = load_settings(spec.get("config"))
        apply_serve_options(settings, **spec.get("options", {}))
        settings.server.http_port = spec["http_port"]
        if spec.get("grpc_port") is not None:
            settings.server.grpc_port = spec["grpc_port"]
        if spec.get("state_dir") and not settings.monitoring.quality_path:
            # the pool's shared label join when no Redis holds it (monitoring/joinstore.py)
            settings.monitoring.quality_path = os.path.join(spec["state_dir"], "labels.sqlite")
        server = build_server(settings)
        from redline.scaling.rollout import install

        install(server)
        server.http_socket = socket.socket(fileno=spec["http_fd"])
        board = LoadBoard(spec["board_fd"])
        from redline.scaling.accept import FairAccept

        server.listen_with = FairAccept.on(board, spec["slot"])  # a fair share of connections
        meter = LoadMeter(board, spec["slot"])  # both transports count towards the autoscaler
        app: Any = server.app
        join_per_worker = False
        if settings.monitoring.enabled:
            from redline.monitoring.joinstore import join_backend_kind

            join_per_worker = join_backend_kind(settings) == "memory"
        admin_token = settings.server.admin_token if settings.server.admin_enabled else None
        if join_per_worker or admin_token:
            from redline.scaling.pooled import PooledWorkerGuard

            # refused in a pool: a label join kept per process, an admin load/unload
            app = PooledWorkerGuard(app, label_join_per_worker=join_per_worker,
                                    admin_token=admin_token)
        server.asgi = AsgiMeter(app, meter)
        server.grpc_interceptors.append(GrpcMeter(meter))
        if settings.features.preload:
            preload_store(server, settings.features.preload)
        import uvloop

        uvloop.run(_serve(server, board, spec["slot"]))
    except RedlineError as exc:
        print(f"error [{exc.code}]: {exc.message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
