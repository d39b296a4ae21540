"""What a pool of workers refuses because one worker could not answer it truthfully.

A pool shares its label join, quality figures and review queue (``monitoring/joinstore.py``,
``reviewstore.py``: Redis when the features are there, else a SQLite file in the pool's state
directory), and rollouts through the rollout file every worker polls. Two kinds of call still
reach one worker process only, and a pooled worker answers them with a clear 409
(``per_worker_state``) naming the fix, rather than a success that is true of one process:

- with ``monitoring.quality_store: memory`` the join and review queue are kept per process: a
  label could reach a worker that never saw its prediction, a quality read or review list would
  show one worker's share (``POST /v1/labels``, ``GET .../quality``, ``/v1/review...``);
- with the admin API on, ``POST /v2/repository/models/{name}/load`` and ``/unload`` change the
  models of the one worker that answers while the others serve on as before. The read-only admin
  routes (index, slow log, review queue) answer from any worker.

An admin call without the right token is passed on untouched, so it still gets its 401.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

from redline.errors import PerWorkerState
from redline.serving.edge import http_error

if TYPE_CHECKING:
    from redline.serving.asgi import InlineApp

MESSAGE = (
    "monitoring.quality_store is memory, so the label join, the quality figures and the review "
    "queue are kept per worker process, and this server runs several workers behind one port "
    "(--workers N or scaling.max_workers): a label could reach a worker that never saw its "
    "prediction and be lost. Set monitoring.quality_store to auto (the workers then share a "
    "SQLite file, or Redis with features.store: redis), or serve with one worker "
    "(`redline serve --workers 1`)")

ADMIN_MESSAGE = (
    "{action} of model '{name}' would reach only the one worker process that answers, and this "
    "server runs several workers behind one port (--workers N or scaling.max_workers): the "
    "others would keep serving as before. Change versions through the repository, which every "
    "worker watches (`redline models add`, `promote` or `rollback`, with "
    "server.watch_repository on), or serve with one worker (`redline serve --workers 1`)")


def per_worker_only(method: str, path: str) -> bool:
    """The label join's and review queue's routes: ``POST /v1/labels``, ``GET
    /v1/models/{name}[/versions/{v}]/quality`` and every ``/v1/review`` route."""
    if path == "/v1/review" or path.startswith("/v1/review/"):
        return True
    if method == "POST":
        return path == "/v1/labels"
    return method == "GET" and path.startswith("/v1/models/") and path.endswith("/quality")


def per_worker_admin(method: str, path: str) -> tuple[str, str] | None:
    """``(action, model)`` for an admin call that changes one process's models, else None."""
    parts = path.strip("/").split("/")
    if (method == "POST" and len(parts) == 5 and parts[:3] == ["v2", "repository", "models"]
            and parts[4] in ("load", "unload")):
        return parts[4], parts[3]
    return None


class PooledWorkerGuard:
    """ASGI wrapper of a pooled worker: refuses what only one worker could answer truthfully.
    It refuses no V2 inference: the HTTP protocol's inline lane goes straight to the app's."""

    def __init__(self, app: InlineApp, *, label_join_per_worker: bool = True,
                 admin_token: str | None = None) -> None:
        self.app = app
        self.infer_inline = app.infer_inline
        self.label_join_per_worker = label_join_per_worker
        self._bearer = b"Bearer " + admin_token.encode() if admin_token else None
        self._join = _response(MESSAGE)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            refused: tuple[dict[str, Any], dict[str, Any]] | None = None
            if self.label_join_per_worker and per_worker_only(method, path):
                refused = self._join
            elif self._bearer is not None:
                call = per_worker_admin(method, path)
                if call is not None and self._authorised(scope):
                    action, name = call
                    refused = _response(ADMIN_MESSAGE.format(
                        action="a load" if action == "load" else "an unload", name=name))
            if refused is not None:
                await send(refused[0])
                await send(refused[1])
                return
        await self.app(scope, receive, send)

    def _authorised(self, scope: Any) -> bool:
        """The admin token is right (a wrong one goes on to the app, which answers 401)."""
        assert self._bearer is not None
        given = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(given, self._bearer)


def _response(message: str) -> tuple[dict[str, Any], dict[str, Any]]:
    status, body, headers = http_error(PerWorkerState(message))
    return ({"type": "http.response.start", "status": status,
             "headers": [*headers, (b"content-length", str(len(body)).encode())]},
            {"type": "http.response.body", "body": body})
