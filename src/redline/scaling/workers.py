"""``redline serve --workers N``: N worker processes behind one pair of ports, under a supervisor.

The supervisor binds the HTTP socket once (and starts listening, so connections wait in the
kernel's queue rather than being refused while a worker restarts) and hands it to every worker;
each worker binds the gRPC port itself with SO_REUSEPORT. Every worker is a full server: its own
event loop, registry and ONNX Runtime sessions (``scaling/worker.py``). The supervisor loads no
model; it only starts, watches, restarts and stops workers:

- a worker that dies is restarted at once; one that keeps dying (several crashes inside
  ``scaling.crash_window_s``) waits an exponential back-off first, so a broken model does not
  spin the machine;
- a worker only accepts connections once its models are warm, so whichever worker answers a
  readiness probe is truly ready; with none up the probe waits in the queue and times out;
- SIGTERM (or SIGINT) closes the supervisor's copy of the listening socket and sends SIGTERM to
  every worker, which drains its in-flight requests (``server.drain_timeout_s``) and exits;
- with ``scaling.max_workers > scaling.min_workers`` the autoscaler adds and retires workers from
  their queue depth and p99 (``scaling/autoscaler.py``).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redline.config import Settings
from redline.errors import ConfigError
from redline.scaling.autoscaler import Autoscaler, LoadSample, ScalePolicy
from redline.scaling.forked import ForkedWorker, fork_safe, preimport
from redline.scaling.loadmeter import MAX_SLOTS, LoadBoard

log = logging.getLogger("redline.scaling")

USER_ERROR_EXIT = 2  # a worker that exits 2 before it ever served met a user error: stop


def resolve_workers(settings: Settings, requested: int | None) -> int:
    """How many workers to run; refuses a count that would make workers disagree."""
    asked = settings.scaling.workers if requested is None else requested
    if asked < 0:
        raise ConfigError(f"--workers must be 0 (one per core) or more, got {asked}")
    local_state = settings.features.store == "memory" and bool(settings.features.definitions)
    # The admin API does not forbid a pool: its read-only routes (slow log, review queue,
    # index) answer from any worker, and the routes that would change one process only (model
    # load/unload) answer 409 per_worker_state in a pool (scaling/pooled.py). Left to the
    # default (workers: 0) it keeps one worker, so the load/unload it documents keep working;
    # a pool with admin on is asked for explicitly (--workers N, scaling.max_workers).
    if settings.scaling.max_workers > 1 and local_state:
        raise ConfigError(
            "autoscaling (scaling.max_workers > 1) needs state every worker shares: set "
            "`features.store: redis`")
    preload = bool(settings.features.preload)
    if asked == 0:
        if local_state or preload or settings.server.admin_enabled:
            return 1  # state that must agree would diverge, or admin load/unload: stay at one
        return max(1, os.cpu_count() or 1)
    if asked > 1 and local_state:
        raise ConfigError(
            f"--workers {asked} with the in-memory feature store would give each worker its own "
            "features and sessions; set `features.store: redis` (or --redis-url) so workers share "
            "them, or run one worker")
    if asked > 1 and preload:
        raise ConfigError(
            f"--workers {asked} with --preload would replay the event file once per worker (and "
            "again on every restart); load the shared store once with `redline ingest file "
            "FILE --store redis`, then serve without --preload")
    if asked > MAX_SLOTS:
        raise ConfigError(f"--workers {asked} is more than {MAX_SLOTS}")
    return asked


@dataclass
class _Worker:
    slot: int
    proc: subprocess.Popen[bytes] | ForkedWorker | None = None
    started: float = 0.0
    restart_at: float | None = None
    retiring: bool = False
    served: bool = False  # has been seen up (its slot carries its pid)
    crashes: deque[float] = field(default_factory=deque)


class Supervisor:
    """Starts, watches, restarts and stops the worker processes of one ``redline serve``."""

    def __init__(self, settings: Settings, worker_args: dict[str, Any], workers: int) -> None:
        self.settings = settings
        self.worker_args = worker_args  # what each worker passes to load_settings + options
        self.count = workers
        self.workers: dict[int, _Worker] = {}
        self.restarts = 0
        self._finished: dict[int, int] = {}
        self._stopping = False
        self._exit_code = 0
        s = settings.scaling
        self.autoscaler: Autoscaler | None = None
        if s.max_workers > max(s.min_workers, 0):
            self.autoscaler = Autoscaler(ScalePolicy(
                min_workers=max(1, s.min_workers), max_workers=s.max_workers,
                objective_p99_ms=settings.server.default_slo_ms, queue_high=s.queue_high,
                queue_low=s.queue_low, up_cooldown_s=s.scale_up_cooldown_s,
                down_cooldown_s=s.scale_down_cooldown_s))
            self.count = min(max(self.count, s.min_workers, 1), s.max_workers)

    # ------------------------------------------------------------------ sockets
    def _bind(self) -> None:
        server = self.settings.server
        family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((server.host, server.http_port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot listen for HTTP on {server.host}:{server.http_port}: "
                              f"{exc.strerror}; choose another --http-port (0 = any free port)"
                              ) from None
        sock.listen(2048)
        sock.set_inheritable(True)
        self.http = sock
        self.http_port = sock.getsockname()[1]
        self.grpc_port: int | None = None
        self._grpc_hold: socket.socket | None = None
        if server.grpc_enabled:
            # Hold the gRPC port (bound, not listening) so port 0 becomes one port every worker
            # then binds with SO_REUSEPORT; a bound socket that never listens receives nothing.
            # SO_REUSEPORT would as gladly join another server's listener on that port (a
            # second pool then answered most of the first one's calls): first the port must be
            # free for a socket that shares it with nobody.
            hold = socket.socket(family, socket.SOCK_STREAM)
            try:
                if server.grpc_port:
                    with socket.socket(family, socket.SOCK_STREAM) as probe:
                        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT
                        probe.bind((server.host, server.grpc_port))
                hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                hold.bind((server.host, server.grpc_port))
            except OSError as exc:
                hold.close()
                raise ConfigError(f"cannot listen for gRPC on {server.host}:{server.grpc_port}: "
                                  f"{exc.strerror}; choose another --grpc-port (0 = any free "
                                  "port) or --no-grpc") from None
            self._grpc_hold = hold
            self.grpc_port = hold.getsockname()[1]

    # ------------------------------------------------------------------ workers
    def _spawn(self, worker: _Worker) -> None:
        spec = {**self.worker_args, "http_fd": self.http.fileno(), "http_port": self.http_port,
                "grpc_port": self.grpc_port, "board_fd": self.board.fd, "slot": worker.slot,
                "state_dir": self._state_dir.name}
        self.board.reset(worker.slot)
        if self._fork and fork_safe():
            worker.proc = ForkedWorker(spec)  # a fork keeps the shared sockets
        else:
            env = {**os.environ, "REDLINE_WORKER": json.dumps(spec)}
            worker.proc = subprocess.Popen(
                [sys.executable, "-m", "redline.scaling.worker"], env=env,
                pass_fds=(self.http.fileno(), self.board.fd), preexec_fn=_die_with_parent)
        worker.started = time.monotonic()
        worker.restart_at = None
        worker.served = False
        log.info("worker %s started (pid %s)", worker.slot, worker.proc.pid)

    def _add(self) -> None:
        slot = next(i for i in range(MAX_SLOTS) if i not in self.workers)
        self.workers[slot] = worker = _Worker(slot)
        self._spawn(worker)

    def _retire_one(self) -> None:
        live = [w for w in self.workers.values() if not w.retiring and w.proc is not None]
        if len(live) <= 1:
            return
        worker = max(live, key=lambda w: w.slot)
        worker.retiring = True
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGTERM)  # drains, then exits
        log.info("worker %s retiring (pid %s)", worker.slot, worker.proc.pid)

    def _reap(self, now: float) -> None:
        s = self.settings.scaling
        for slot, worker in list(self.workers.items()):
            proc = worker.proc
            if proc is None:
                if worker.restart_at is not None and now >= worker.restart_at:
                    self._spawn(worker)
                continue
            if not worker.served and self.board.read(slot)[3] == proc.pid:
                worker.served = True
            code = proc.poll()
            if code is None:
                continue
            _metrics_worker_exited(proc.pid)
            self.board.reset(slot)  # no one counts on a dead worker (its connections, its load)
            if worker.retiring:
                del self.workers[slot]
                continue
            if code == USER_ERROR_EXIT and not worker.served:
                log.error("worker %s could not start (exit %s); stopping", slot, code)
                self._exit_code = code
                self._stopping = True
                return
            # A crash: restart now, or after a back-off when it keeps crashing.
            while worker.crashes and now - worker.crashes[0] > s.crash_window_s:
                worker.crashes.popleft()
            worker.crashes.append(now)
            delay = 0.0 if len(worker.crashes) <= 1 else min(
                s.max_restart_backoff_s, s.restart_backoff_s * 2 ** (len(worker.crashes) - 2))
            log.warning("worker %s (pid %s) died with %s; restarting in %.1fs", slot, proc.pid,
                        _describe(code), delay)
            worker.proc = None
            worker.restart_at = now + delay
            self.restarts += 1
            if delay == 0.0:
                self._spawn(worker)

    def sample(self) -> LoadSample:
        live = [w for w in self.workers.values() if not w.retiring]
        in_flight = 0.0
        p99 = 0.0
        for worker in live:
            flying, finished, p99_us, pid = self.board.read(worker.slot)
            if worker.proc is not None and pid == worker.proc.pid:
                in_flight += flying
                # A worker's p99 is of its recent requests; one that finished nothing since the
                # last tick is idle, and its old p99 no longer says anything about now.
                if flying or finished != self._finished.get(worker.slot):
                    p99 = max(p99, p99_us / 1000.0)
                self._finished[worker.slot] = finished
        return LoadSample(len(live), in_flight, p99)

    # ------------------------------------------------------------------ main loop
    def run(self, ports_claimed: Callable[[], None] | None = None) -> int:
        """Supervise until stopped; ``ports_claimed`` runs once both ports are taken."""
        self._bind()
        if ports_claimed is not None:
            ports_claimed()
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Every worker writes its metrics files here; any worker's /metrics merges them all.
            self._metrics_dir = tempfile.TemporaryDirectory(prefix="redline-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self._metrics_dir.name
        # The pool's state directory: the workers' shared label join (a SQLite file) when no
        # Redis holds it (monitoring/joinstore.py); it lives as long as the pool.
        self._state_dir = tempfile.TemporaryDirectory(prefix="redline-state-")
        self.board = LoadBoard.create()
        # Workers are forks of this process with the serving stack already imported, so a
        # replacement starts at its settings (``scaling/forked.py``); a fresh interpreter each
        # where forking is not safe or REDLINE_WORKER_EXEC=1 asks for it.
        self._fork = hasattr(os, "fork") and os.environ.get("REDLINE_WORKER_EXEC") != "1"
        if self._fork:
            log.info("worker imports done in the supervisor in %.2f s (each worker is a fork)",
                     preimport())
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        log.info("redline supervising %s workers: http %s:%s grpc %s", self.count,
                 self.settings.server.host, self.http_port, self.grpc_port or "off")
        for _ in range(self.count):
            self._add()
        interval = self.settings.scaling.autoscale_interval_s
        next_scale = time.monotonic() + interval
        while not self._stopping:
            now = time.monotonic()
            self._reap(now)
            if self.autoscaler is not None and now >= next_scale and not self._stopping:
                next_scale = now + interval
                self._scale(now)
            time.sleep(0.02)
        self._shutdown()
        return self._exit_code

    def _scale(self, now: float) -> None:
        assert self.autoscaler is not None
        sample = self.sample()
        decision = self.autoscaler.tick(sample, now)
        for _ in range(decision.target - sample.workers):
            self._add()
        for _ in range(sample.workers - decision.target):
            self._retire_one()

    def stop(self) -> None:
        self._stopping = True

    def _shutdown(self) -> None:
        """Drain: no new connections here, SIGTERM to every worker, wait, then kill stragglers."""
        self.http.close()
        if self._grpc_hold is not None:
            self._grpc_hold.close()
        procs = [w.proc for w in self.workers.values() if w.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        server = self.settings.server
        deadline = time.monotonic() + server.drain_grace_s + server.drain_timeout_s + 5
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.warning("redline workers stopped")


def _metrics_worker_exited(pid: int) -> None:
    """A dead worker's live gauges leave the merged scrape (monitoring's multiprocess files)."""
    try:
        from redline.monitoring.prometheus import worker_exited
    except ImportError:  # pragma: no cover - monitoring not installed in this build
        return
    worker_exited(pid)


def _describe(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it (a drain) if the supervisor itself dies."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_supervised(settings: Settings, worker_args: dict[str, Any], workers: int,
                   ports_claimed: Callable[[], None] | None = None) -> None:
    """Block supervising ``workers`` processes until SIGTERM; exits with the supervisor's code.
    ``ports_claimed`` runs once the ports are taken (a warning after a port's refusal would be
    a second line for nothing)."""
    code = Supervisor(settings, worker_args, workers).run(ports_claimed)
    if code:
        sys.exit(code)
