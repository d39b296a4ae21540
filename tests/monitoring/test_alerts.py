"""The alert webhook against a real local HTTP receiver: first call, back-off, resolution."""

from __future__ import annotations

import logging
import time

import pytest

from redline.monitoring.alerts import AlertWebhook


def wait_for(got: list, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(got) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_backoff_doubles_then_resolves(webhook_receiver: tuple[str, list[dict]]) -> None:
    url, got = webhook_receiver
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


def test_a_dead_receiver_never_blocks_or_raises(caplog: pytest.LogCaptureFixture) -> None:
    hook = AlertWebhook("http://127.0.0.1:9/nothing-listens", timeout_s=0.2)
    t = time.perf_counter()
    with caplog.at_level(logging.WARNING, "redline.monitoring"):
        hook.update({"latency:m": {"kind": "latency"}, "drift:m:1": {"kind": "drift"}})
        assert time.perf_counter() - t < 0.05
        deadline = time.monotonic() + 5
        while hook.failed < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        hook.close()
    assert hook.failed == 2 and hook.sent == 0
    # One WARNING line for the outage (address and reason, no traceback), not one per send.
    lines = [r for r in caplog.records if r.name == "redline.monitoring"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.WARNING and lines[0].exc_info is None
    message = lines[0].getMessage()
    assert "http://127.0.0.1:9/nothing-listens" in message and "Error" in message
    assert "\n" not in message
