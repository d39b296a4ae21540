"""A server with what attaches to it: where serving and monitoring meet, above both.

Serving offers extension points (request observers, routes, companions) and imports neither
monitoring nor scaling; monitoring attaches to those points and imports serving's types. This
module builds a :class:`RedlineServer` and attaches its monitoring when
``monitoring.enabled``; every process that serves (``redline serve``, a worker, the demo) is
built here.
"""

from __future__ import annotations

from redline.config import Settings
from redline.models import ModelRepository
from redline.serving.server import RedlineServer


def build_server(settings: Settings, repository: ModelRepository | None = None) -> RedlineServer:
    """A server for ``settings``, monitored when ``monitoring.enabled``."""
    server = RedlineServer(settings, repository)
    if settings.monitoring.enabled:
        from redline.monitoring import attach

        attach(server)
    return server


def run(settings: Settings, repository: ModelRepository | None = None) -> None:
    """Block serving until SIGTERM/SIGINT."""
    import uvloop

    uvloop.run(build_server(settings, repository).serve())
