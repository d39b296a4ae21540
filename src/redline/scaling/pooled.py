"""What a pool refuses when its label join is kept per worker process.

A pool of workers shares its label join and quality figures (``monitoring/joinstore.py``: Redis
when the features are there, else a SQLite file in the pool's state directory). Only a pool told
to keep them in each process (``monitoring.quality_store: memory``) cannot answer truthfully: a
label reaches any worker, most often not the one holding its prediction, and each quality read
would show one worker's share. Such a worker answers ``POST /v1/labels`` and ``GET
.../quality`` with a clear 409 (``per_worker_state``) naming the fix.
"""

from __future__ import annotations

from typing import Any

from redline.errors import PerWorkerState
from redline.serving.edge import http_error

MESSAGE = (
    "monitoring.quality_store is memory, so the label join and the quality figures are kept per "
    "worker process, and this server runs several workers behind one port (--workers N or "
    "scaling.max_workers): a label could reach a worker that never saw its prediction and be "
    "lost. Set monitoring.quality_store to auto (the workers then share a SQLite file, or Redis "
    "with features.store: redis), or serve with one worker (`redline serve --workers 1`)")


def per_worker_only(method: str, path: str) -> bool:
    """``POST /v1/labels`` and ``GET /v1/models/{name}[/versions/{v}]/quality``."""
    if method == "POST":
        return path == "/v1/labels"
    return method == "GET" and path.startswith("/v1/models/") and path.endswith("/quality")


class PooledWorkerGuard:
    """ASGI wrapper of a pooled worker: refuses what only one worker could answer truthfully."""

    def __init__(self, app: Any) -> None:
        self.app = app
        status, body, headers = http_error(PerWorkerState(MESSAGE))
        self._start = {"type": "http.response.start", "status": status,
                       "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        self._body = {"type": "http.response.body", "body": body}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and per_worker_only(scope["method"], scope["path"]):
            await send(self._start)
            await send(self._body)
            return
        await self.app(scope, receive, send)
