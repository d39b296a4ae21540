"""Records as the serving code leaves them, for feeding the observers directly, and a monitor
of a registry with nothing loaded."""

from __future__ import annotations

from typing import Any

from redline.errors import ModelNotFound
from redline.monitoring.monitor import MonitoredVersion, ServerMonitor, VersionFolders
from redline.serving.stages import RequestRecord


def record(model: str = "m", version: str = "1", api: str = "v2", transport: str = "rest",
           stages: dict[str, int] | None = None, status: str = "ok", path: str = "primary",
           request_id: str = "", inputs: Any = None, outputs: Any = None, rows: int = 1,
           traceparent: str | None = None, start_ns: int = 1_000_000_000) -> RequestRecord:
    """A finished record whose stages took the given microseconds, back to back."""
    r = RequestRecord(api, transport, start_ns)
    r.model, r.version, r.path, r.request_id, r.rows = model, version, path, request_id, rows
    r.inputs, r.outputs, r.traceparent = inputs, outputs, traceparent
    t = start_ns
    for stage, us in (stages or {"decode": 10, "queue": 5, "inference": 40, "encode": 8}).items():
        r.add(stage, t, t + us * 1000)
        t += us * 1000
    r.finish(status, t + 2000)
    return r


class NoModels:
    """A registry with no model loaded (``monitor.MonitoredModels``): the monitor asks for a
    version only when a window needs its metadata, and there is none."""

    repository: VersionFolders | None = None

    def models(self) -> list[str]:
        return []

    def loaded(self, name: str) -> list[MonitoredVersion]:
        return []

    def get(self, name: str, version: str | None = None) -> MonitoredVersion:
        raise ModelNotFound(f"model '{name}' is not loaded")


def idle_monitor(settings: Any) -> ServerMonitor:
    """A server's monitor with ``settings`` and no model loaded."""
    return ServerMonitor(settings, NoModels())
