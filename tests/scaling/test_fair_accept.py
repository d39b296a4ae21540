"""A pool's workers share the HTTP connections opened together (``scaling/accept.py``)."""

from __future__ import annotations

import collections
import json
import select
import socket
import time
from pathlib import Path

import pytest

from tests.scaling.procs import Serve

pytestmark = pytest.mark.slow  # a server with two worker processes

WHO = b"GET /v1/monitoring/summary HTTP/1.1\r\nHost: x\r\n\r\n"


def _answer(sock: socket.socket) -> dict:  # type: ignore[type-arg]
    """One HTTP/1.1 response's JSON body (Content-Length framed), read off ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    return json.loads(body)  # type: ignore[no-any-return]


def _worker_of_each(port: int, connections: int) -> list[int]:
    """Open ``connections`` at once (as a client's pool does), then ask on each which worker
    holds it; the connections stay open until all have answered."""
    socks = [socket.socket() for _ in range(connections)]
    try:
        for sock in socks:  # all the handshakes at once, none waited for
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
        for sock in socks:
            select.select([], [sock], [], 10)
            sock.setblocking(True)
            sock.settimeout(10)
            sock.sendall(WHO)
        return [_answer(sock)["worker_pid"] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def test_connections_opened_together_are_shared_by_the_workers(tmp_path: Path) -> None:
    """Eight keep-alive connections opened at once land four and four (one either way) on two
    workers, round after round. Left to the event loop, the worker that woke first accepted
    every connection waiting: all eight on one worker in some rounds (this test failed so in
    5 of 5 tries with the loop's own accept)."""
    serve = Serve(tmp_path, "--workers", "2").wait_ready()
    try:
        serve.wait_children(2)
        deadline = time.monotonic() + 60
        while serve.log.read_text().count("redline serving") < 2:
            assert time.monotonic() < deadline, serve.log.read_text()[-2000:]
            time.sleep(0.05)
        rounds = []
        for _ in range(20):
            rounds.append(collections.Counter(_worker_of_each(serve.http_port, 8)))
            time.sleep(0.2)  # the closed connections leave the workers' counts
        for held in rounds:
            assert len(held) == 2 and all(3 <= n <= 5 for n in held.values()), rounds
    finally:
        assert serve.stop() == 0


def test_a_stuck_worker_holds_up_no_connection(tmp_path: Path) -> None:
    """With one worker stopped (SIGSTOP: alive, holding fewer connections, accepting none),
    the other steps aside for each new connection at most ``STEP_ASIDE_S``, then takes it:
    every connection is answered, by the live worker, soon. Once the stuck worker goes on,
    the connections are shared again."""
    import os
    import signal

    from redline.scaling.accept import STEP_ASIDE_S

    serve = Serve(tmp_path, "--workers", "2").wait_ready()
    try:
        kids = serve.wait_children(2)
        deadline = time.monotonic() + 60
        while serve.log.read_text().count("redline serving") < 2:
            assert time.monotonic() < deadline, serve.log.read_text()[-2000:]
            time.sleep(0.05)
        stuck = kids[0]
        os.kill(stuck, signal.SIGSTOP)
        try:
            started = time.monotonic()
            held = collections.Counter(_worker_of_each(serve.http_port, 8))
            took = time.monotonic() - started
        finally:
            os.kill(stuck, signal.SIGCONT)
        assert set(held) == {kids[1]}, held
        # eight connections, each stepped aside for at most STEP_ASIDE_S (and a busy
        # machine's scheduling on top): far below a client's connect timeout
        assert took < 8 * STEP_ASIDE_S + 2.0, took
        time.sleep(0.2)
        shared = collections.Counter(_worker_of_each(serve.http_port, 8))
        assert len(shared) == 2 and all(3 <= n <= 5 for n in shared.values()), shared
    finally:
        assert serve.stop() == 0
