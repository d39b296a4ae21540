"""The alert webhook against a real local HTTP receiver: first call, back-off, resolution."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from redline.monitoring.alerts import AlertWebhook


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict]]]:
    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()


def wait_for(got: list, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(got) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_backoff_doubles_then_resolves(receiver: tuple[str, list[dict]]) -> None:
    url, got = receiver
    clock = [0.0]
    hook = AlertWebhook(url, min_interval_s=10, max_interval_s=40, clock=lambda: clock[0])
    firing = {"drift:m:1": {"kind": "drift", "features": ["age"]}}
    sent_at = []
    for second in range(0, 200):  # one tick a second for 200 s of one incident
        clock[0] = float(second)
        before = len(hook._outbox.queue) + hook.sent
        hook.update(firing)
        if len(hook._outbox.queue) + hook.sent > before:
            sent_at.append(second)
    assert sent_at == [0, 10, 30, 70, 110, 150, 190]  # 10, 20, 40, 40, ... apart
    clock[0] = 201.0
    hook.update({})
    wait_for(got, 8)
    hook.close()
    assert [g["status"] for g in got] == ["firing"] * 7 + ["resolved"]
    assert got[0]["alert"] == "drift:m:1" and got[0]["features"] == ["age"]
    assert hook.suppressed == 200 - 7


def test_a_dead_receiver_never_blocks_or_raises() -> None:
    hook = AlertWebhook("http://127.0.0.1:9/nothing-listens", timeout_s=0.2)
    t = time.perf_counter()
    hook.update({"latency:m": {"kind": "latency"}})
    assert time.perf_counter() - t < 0.05
    deadline = time.monotonic() + 5
    while hook.failed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    hook.close()
    assert hook.failed == 1 and hook.sent == 0
