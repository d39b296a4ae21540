"""Real ``redline serve`` processes for the scaling tests, and a bounded load that counts failures.

Failure accounting (the same in every chaos test): an inference is *failed* when the caller got
no 200 after at most ``retries`` more tries on a fresh connection. A retry happens only on a
connection-level error (refused, reset, closed before any response), a timeout, or a load
balancer's own 502 page (HAProxy 2.6 answers one when a replica dies under a connection it
reused; ``redline.Client`` resends it too): V2 inference has no side effects, so sending it
again is safe. Retries are counted and reported next to
failures.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from redline.models import ModelRepository
from tests.conftest import free_port
from tests.logwatch import watch_file
from tests.serving.helpers import affine_model

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
CONFIG = ("runtime:\n  warmup_batch_sizes: [1]\n  warmup_runs: 1\n"
          "server:\n  drain_timeout_s: 5\n  watch_repository: false\n")


def make_repo(root: Path) -> Path:
    repo = ModelRepository(root / "repo")
    repo.add_onnx("affine", affine_model())
    return root / "repo"


class Serve:
    """``redline serve`` as a child process on free ports; ``stop()`` is SIGTERM then wait."""

    def __init__(self, root: Path, *extra: str, config: str = CONFIG,
                 env: dict[str, str] | None = None) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        cfg = root / f"redline-{self.http_port}.yaml"
        cfg.write_text(config)
        self.log = root / f"serve-{self.http_port}.log"
        self._log = self.log.open("w")
        watch_file(self.log, f"redline serve :{self.http_port}")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "redline.cli", "serve", "--config", str(cfg), "--repository",
             str(make_repo(root) if not (root / "repo").exists() else root / "repo"),
             "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
             "--log-level", "info", *extra],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"

    def wait_ready(self, timeout: float = 60.0) -> Serve:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"redline serve exited: {self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"not ready in {timeout}s: {self.log.read_text()[-3000:]}")

    def children(self) -> list[int]:
        """The worker pids (the supervisor's child processes)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            return [int(p) for p in path.read_text().split()]
        except OSError:
            return []

    def wait_children(self, count: int, timeout: float = 60.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kids = self.children()
            if len(kids) == count:
                return kids
            time.sleep(0.05)
        raise AssertionError(f"expected {count} workers, have {self.children()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@dataclass
class LoadResult:
    ok: int = 0
    failed: int = 0
    retries: int = 0
    errors: list[str] = field(default_factory=list)


class SteadyLoad:
    """``threads`` closed-loop keep-alive callers of ``url`` for at most ``seconds``.

    Connection-level errors are retried (up to ``retries`` times) on a fresh connection.
    """

    def __init__(self, url: str, threads: int = 4, seconds: float = 20.0, retries: int = 2,
                 path: str = "/v2/models/affine/infer", pause_s: float = 0.002,
                 body: dict | None = None) -> None:  # type: ignore[type-arg]
        self.url, self.path, self.retries, self.pause = url, path, retries, pause_s
        self.body = body or BODY
        self.answers: list[dict] = []  # type: ignore[type-arg]
        self.result = LoadResult()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._deadline = time.monotonic() + seconds
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> SteadyLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> LoadResult:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        return self.result

    def _run(self) -> None:
        # A generous budget: these tests are about availability on a shared, busy machine; a
        # request queued 100 ms behind a CPU hiccup is slow, not failed.
        client = httpx.Client(base_url=self.url, timeout=10.0,
                              headers={"x-redline-budget-ms": "5000"})
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                self._one(client)
                time.sleep(self.pause)
        finally:
            client.close()

    def _one(self, client: httpx.Client) -> None:
        last = ""
        for attempt in range(self.retries + 1):
            try:
                r = client.post(self.path, json=self.body)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError,
                    httpx.WriteError, httpx.TimeoutException) as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if r.status_code != 502 or r.headers.get("content-type", "").startswith(
                        "application/json"):  # an answer, not the balancer's own page
                    with self._lock:
                        if r.status_code == 200:
                            self.result.ok += 1
                            self.answers.append(r.json())
                        else:
                            self.result.failed += 1
                            self.result.errors.append(f"{r.status_code} {r.text[:200]}")
                    return
                last = f"502 from the balancer: {r.text[:120]}"
            with self._lock:
                if attempt < self.retries:
                    self.result.retries += 1
        with self._lock:
            self.result.failed += 1
            self.result.errors.append(f"{time.time():.3f} {last}")
