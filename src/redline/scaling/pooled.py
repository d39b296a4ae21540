"""What a pool of workers refuses: requests for state that each worker process keeps alone.

The label join (``POST /v1/labels``) and the quality figures (``GET .../quality``) live in the
memory of the worker that served the predictions. Behind one shared port a label reaches any
worker, most often not the one holding its prediction: it would be counted as unmatched and
lost, and each quality read would show a different worker's share. So a worker of a pool
(``--workers N`` with N > 1, or autoscaling) answers those requests with a clear 409
(``per_worker_state``) that says to serve labelled traffic with one worker. Drift, metrics and
everything else work with any number of workers.
"""

from __future__ import annotations

from typing import Any

from redline.errors import PerWorkerState
from redline.serving.edge import http_error

MESSAGE = (
    "the label join and the quality figures are kept per worker process, and this server runs "
    "several workers behind one port (--workers N or scaling.max_workers), so a label could "
    "reach a worker that never saw its prediction and be lost. Serve the traffic whose labels "
    "you post with one worker (`redline serve --workers 1`, scaling.workers: 1); drift, "
    "metrics and predictions work with any number of workers")


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
