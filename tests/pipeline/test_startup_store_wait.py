"""A server whose start writes the shared store (``features.preload`` into Redis) waits for a
Redis that does not answer yet, says so, and starts once it does, counting each event once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis

from tests.conftest import RedisServer, free_port
from tests.logwatch import log_to
from tests.pipeline.test_warmup import wait_ready

pytestmark = pytest.mark.slow  # a child server


@pytest.mark.allow_log(r"waiting for the online store")
def test_preload_waits_for_a_redis_that_does_not_answer_yet(
        tmp_path: Path, redis_server: RedisServer, repo_path: Path, defs_path: Path) -> None:
    ts = int(time.time() * 1000)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(
        orjson.dumps({"card_id": f"p{i % 50}", "amount": 1.0, "ts": ts - i * 1000})
        for i in range(500)))
    config = tmp_path / "redline.yaml"
    config.write_text(f"repository: {repo_path}\nfeatures:\n  definitions: {defs_path}\n"
                      f"  store: redis\n  redis_url: {redis_server.url}\n  preload: {events}\n"
                      "server:\n  watch_repository: false\n")
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)  # a Redis that accepts but does not answer
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    with log_to(log) as out:
        proc = subprocess.Popen([sys.executable, "-m", "redline.cli", "serve", "--config",
                                 str(config), "--http-port", str(port), "--no-grpc"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "waiting for the online store" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        redis_server.proc.send_signal(signal.SIGCONT)
        wait_ready(proc, f"http://127.0.0.1:{port}", log)
        text = log.read_text()
        assert "start-up: online store" in text and "answers after" in text, text[-2000:]
        assert "500 events from" in text, text[-2000:]
        client = redis.Redis.from_url(redis_server.url)
        assert client.dbsize() > 0  # the preload reached Redis
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(30)
