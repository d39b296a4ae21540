"""Workers killed under load: what a bare client loses, and the two ways to lose nothing.

A pool of two workers serves three loads at once while its workers are killed in turn: a bare
HTTP client (no retries), ``redline.Client`` (retries of idempotent inference) and a client
through HAProxy with ``deploy/haproxy/haproxy.cfg`` (``retry-on conn-failure empty-response
response-timeout``). Each victim is stopped for a moment before its SIGKILL, so requests are
surely in flight on it when it dies (at a modest rate a sudden SIGKILL catches one now and then;
a hung worker that is then killed catches every request sent to it meanwhile). The bare client
loses those requests (a connection reset); ``redline.Client`` loses none. HAProxy re-sends the
ones the worker had taken in; a request still unread in the dead worker's socket resets a
reused server connection, and HAProxy 2.6 answers that by closing the client's kept-alive
connection without a byte of answer (it logs nothing): HTTP's signal that the request was not
processed, which a client sends anew. Through HAProxy none is lost.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from redline.scaling.client import Client  # redline.Client
from tests.conftest import free_port
from tests.scaling.procs import BODY, Serve
from tests.scaling.test_workers import served_by, slot_pid

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

HAPROXY_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
KILLS = 4
HUNG_S = 0.3  # how long a victim is stopped before its SIGKILL
RATE = 40.0  # requests per second of each load
# Times a request HAProxy gave back unanswered is sent anew: its next try may meet another of
# the dead worker's pooled server connections (seen once in a loaded suite: two in a row).
RESENDS = 3
X = {"x": np.array([[1, 2, 3, 4]], np.float32)}


class Paced:
    """``threads`` callers sending ``rate`` requests a second in all, each on a fixed schedule,
    counting answers and failures (a failure: an exception, or an answer that is not right)."""

    def __init__(self, name: str, make: Callable[[], Callable[[], bool]], rate: float,
                 threads: int = 4) -> None:
        self.name, self.ok, self.failed = name, 0, 0
        self.errors: list[str] = []
        self._make, self._every = make, threads / rate
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        send = self._make()
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                good, why = send(), "a wrong answer"
            except Exception as exc:  # noqa: BLE001 - every failure is counted, with its kind
                good, why = False, f"{type(exc).__name__}: {exc}"
            with self._lock:
                if good:
                    self.ok += 1
                else:
                    self.failed += 1
                    self.errors.append(why)
            due += self._every
            self._stop.wait(max(0.0, due - time.monotonic()))

    def stop(self) -> Paced:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        return self


def bare(url: str) -> Callable[[], Callable[[], bool]]:
    def make() -> Callable[[], bool]:
        client = httpx.Client(base_url=url, timeout=10.0)  # no retries: httpx sends once
        return lambda: client.post("/v2/models/affine/infer", json=BODY).status_code == 200
    return make


class Unanswered:
    """Requests HAProxy gave back unanswered: a kept-alive connection closed without a byte
    of answer, its HTTP/1.1 way of saying "not processed, send it again" (it does so when a
    reused server connection is reset before any answer, instead of retrying it itself); sent
    anew up to ``RESENDS`` times."""

    def __init__(self) -> None:
        self.resent = 0
        self._lock = threading.Lock()

    def client(self, url: str) -> Callable[[], Callable[[], bool]]:
        def make() -> Callable[[], bool]:
            client = httpx.Client(base_url=url, timeout=10.0)

            def send() -> bool:
                for _ in range(RESENDS):
                    try:
                        return client.post("/v2/models/affine/infer", json=BODY).status_code == 200
                    except httpx.RemoteProtocolError as exc:
                        if "without sending a response" not in str(exc):
                            raise
                        with self._lock:
                            self.resent += 1  # and anew: it was not processed
                return client.post("/v2/models/affine/infer", json=BODY).status_code == 200
            return send
        return make


def test_killed_workers_lose_no_request_with_client_retries_or_haproxy(tmp_path: Path) -> None:
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy not installed (`make services` installs it)")
    serve = Serve(tmp_path, "--workers", "2").wait_ready()
    lb_http, lb_grpc = free_port(), free_port()
    env = {**os.environ, "REDLINE_LB_HTTP": f"127.0.0.1:{lb_http}",
           "REDLINE_LB_GRPC": f"127.0.0.1:{lb_grpc}"}
    for n in (1, 2, 3):  # the shipped config's three servers, all this one pool
        env.update({f"REDLINE_R{n}_HOST": "127.0.0.1", f"REDLINE_R{n}_HTTP": str(serve.http_port),
                    f"REDLINE_R{n}_GRPC": str(serve.grpc_port)})
    log_path = tmp_path / "haproxy.log"
    log = log_path.open("w")
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(HAPROXY_CONFIG)], env=env, stdout=log,
                             stderr=subprocess.STDOUT)
    client = Client(serve.url, budget_ms=5000, max_attempts=3)
    unanswered = Unanswered()
    try:
        serve.wait_children(2)
        time.sleep(1.5)  # two good health checks put the servers in HAProxy's rotation
        assert proxy.poll() is None, log_path.read_text()[-2000:]
        loads = [
            Paced("bare client", bare(serve.url), RATE),
            Paced("redline.Client", lambda: lambda: client.infer("affine", X)["s"].tolist()
                  == [10.0], RATE),
            Paced("through HAProxy", unanswered.client(f"http://127.0.0.1:{lb_http}"), RATE),
        ]
        time.sleep(1.0)
        for kill in range(KILLS):
            slot = kill % 2
            victim = slot_pid(serve, slot)
            os.kill(victim, signal.SIGSTOP)  # hung: requests sent to it wait...
            time.sleep(HUNG_S)
            os.kill(victim, signal.SIGKILL)  # ...and die with it
            deadline = time.monotonic() + 60
            while slot_pid(serve, slot) == victim:
                assert time.monotonic() < deadline, serve.log.read_text()[-2000:]
                time.sleep(0.05)
            assert served_by(serve.url, slot_pid(serve, slot), time.monotonic() + 60), \
                serve.log.read_text()[-3000:]
            time.sleep(1.5)
        for load in loads:
            load.stop()
    finally:
        client.close()
        proxy.terminate()
        proxy.wait(10)
        log.close()
        serve.stop()
    plain, retried, balanced = loads
    haproxy_retries = log_path.read_text().count("/+1 ")
    for load in loads:
        print(f"{load.name}: {load.ok} answered, {load.failed} failed {load.errors[:2]}")
    print(f"redline.Client retries: {client.stats.retries}; HAProxy retries: {haproxy_retries}; "
          f"resent after HAProxy closed a connection unanswered: {unanswered.resent}")
    assert retried.failed == 0, retried.errors[:5]
    assert balanced.failed == 0, (balanced.errors[:5], log_path.read_text()[-3000:])
    assert min(load.ok for load in loads) > 10 * RATE  # each load went on through the kills
    # The kills hit requests in flight: the bare client lost some, the others re-sent theirs.
    assert plain.failed > 0 and client.stats.retries > 0, (plain.errors[:5], client.stats)
    assert haproxy_retries + unanswered.resent > 0
    assert all("onnect" in e or "Read" in e or "Protocol" in e for e in plain.errors), \
        plain.errors[:5]
