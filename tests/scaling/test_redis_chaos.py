"""Two workers sharing Redis; Redis stopped under /v1 load: answers degrade, none fail."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import RedisServer
from tests.pipeline.conftest import HERE as PIPELINE_TESTS
from tests.pipeline.conftest import train_models
from tests.scaling.procs import Serve, SteadyLoad

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def test_redis_stopped_under_load_degrades_without_failures(tmp_path: Path,
                                                            redis_server: RedisServer) -> None:
    defs = tmp_path / "defs_cards.py"
    shutil.copy(PIPELINE_TESTS / "defs_cards.py", defs)
    train_models(tmp_path / "repo", defs)
    config = ("runtime:\n  warmup_batch_sizes: [1]\n  warmup_runs: 1\n"
              "server:\n  drain_timeout_s: 5\n  watch_repository: false\n"
              "pipeline:\n  breaker_reset_ms: 50\n")
    serve = Serve(tmp_path, "--workers", "2", "--definitions", str(defs), "--redis-url",
                  redis_server.url, config=config).wait_ready()
    try:
        serve.wait_children(2)
        ts = int(time.time() * 1000)
        events = b"\n".join(orjson.dumps({"card_id": "k1", "amount": 30.0, "ts": ts - i})
                            for i in range(2))
        # The second worker may still be starting (it answers 503 until ready): retry as a
        # client does; any other answer is shown.
        for _ in range(100):
            r = httpx.post(f"{serve.url}/v1/events", content=events, timeout=10)
            if r.status_code != 503:
                break
            time.sleep(0.1)
        assert r.status_code == 200 and r.json()["accepted"] == 2, r.text
        body = {"entities": {"card_id": "k1"}, "request": {"amount": 30.0}, "budget_ms": 1000}
        with SteadyLoad(serve.url, threads=4, seconds=15, retries=0,
                        path="/v1/models/cards/predict", body=body) as load:
            time.sleep(1.0)
            redis_server.kill()
            time.sleep(1.5)
            redis_server.restart()
            time.sleep(1.5)
            result = load.stop()
        answers = load.answers
    finally:
        assert serve.stop() == 0
    assert result.failed == 0, result.errors[:5]
    degraded = [a for a in answers if a["degraded"]]
    assert degraded and all("feature store" in a["degraded_reasons"][0] for a in degraded)
    # Both workers read the same store: before the outage every answer had the features.
    assert not answers[0]["degraded"] and not answers[0]["entity_missing"]
    assert not answers[-1]["degraded"]  # recovered once Redis was back
