"""Workers forked from a supervisor that has already imported the serving stack.

A worker started as a fresh interpreter spends seconds importing numpy, ONNX Runtime and
redline's serving modules before it loads a model; under load that is most of a replacement's
time to serve. The supervisor imports them once (``preimport``), before it starts any worker and
while it still has no event loop, ONNX Runtime session or thread of its own, so a replacement
is a ``fork`` that starts at the settings. ``ForkedWorker`` answers the part of
``subprocess.Popen`` the supervisor uses.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

log = logging.getLogger("redline.scaling")

# What every worker imports before it serves: the heavy part of its start.
PREIMPORTS = (
    "numpy", "onnxruntime", "uvloop", "orjson", "grpc",
    "redline.assembly", "redline.commands.serve", "redline.config",
    "redline.serving.server", "redline.serving.app", "redline.scaling.loadmeter",
    "redline.scaling.rollout", "redline.scaling.pooled", "redline.scaling.worker",
    "redline.features.ingest", "redline.monitoring.monitor", "redline.monitoring.routes",
    "redline.monitoring.metrics", "redline.monitoring.joinstore",
)


def preimport() -> float:
    """Import what a worker needs (those that are installed); returns the seconds spent."""
    started = time.perf_counter()
    for name in PREIMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional piece not installed: the worker does without it
            continue
    return time.perf_counter() - started


def fork_safe() -> bool:
    """Whether forking now leaves the child whole: no other thread holds a lock it needs."""
    return threading.active_count() == 1


class ForkedWorker:
    """A forked worker process, with ``Popen``'s ``pid``/``poll``/``wait``/``send_signal``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns (coverage sees no exit)
            _child(spec)
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                import subprocess

                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _child(spec: dict[str, Any]) -> None:
    """The worker's side of the fork: the supervisor's signal handlers undone, then serve;
    never returns into the supervisor's stack."""
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        from redline.scaling.workers import _die_with_parent

        _die_with_parent()
        if os.getppid() == 1:  # the supervisor died between fork and prctl
            os._exit(1)
        from redline.scaling.worker import run

        run(spec)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported here: nothing above this frame may run
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
