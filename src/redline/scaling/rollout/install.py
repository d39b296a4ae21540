"""A server that follows the rollout file: its router, its observer and its once-a-second tick."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from redline.scaling.rollout.controller import RolloutController
from redline.scaling.rollout.spec import rollout_path

if TYPE_CHECKING:
    from redline.serving.server import RedlineServer

log = logging.getLogger("redline.scaling")


def install(server: RedlineServer) -> RolloutController:
    """Make a server follow ``scaling.rollout_file`` (router + observer), its rollbacks
    counted in the server's metrics and judged on its labels when monitoring is on."""
    monitor = None
    if server.monitor is not None:
        from redline.monitoring import ServerMonitor

        if isinstance(server.monitor, ServerMonitor):
            monitor = server.monitor
    controller = RolloutController(server.registry, rollout_path(server.settings),
                                   labels=monitor.label_joins if monitor is not None else None)
    server.registry.route_by(controller.route)
    controller.observe(server.observers)  # an observer while a rollout is active
    if monitor is not None:
        monitor.count_rollbacks(controller)  # redline_rollout_rollbacks_total
    server.attach(RolloutTicker(controller))
    return controller


class RolloutTicker:
    """Refreshes a controller once a second while its server serves, requests or not.

    Requests refresh it too (``route``), but a worker that has gone idle would otherwise never
    write its last counts, and ``rollout status`` (which reads every process's stats file, and
    drops files older than 30 s) would show stale or vanished counts for a quiet pool."""

    def __init__(self, controller: RolloutController, every_s: float = 1.0) -> None:
        self.controller = controller
        self.every_s = every_s

    async def models_loaded(self) -> None:
        return None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                self.controller.refresh()
            except Exception as exc:  # noqa: BLE001 - the next tick tries again
                log.warning("rollout refresh failed: %s: %s", type(exc).__name__, exc)

    def close(self) -> None:
        return None
