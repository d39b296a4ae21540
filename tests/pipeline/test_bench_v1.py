"""`redline bench --v1` drives /v1 predict over REST and gRPC against a real server."""

from __future__ import annotations

import json
import subprocess
import sys

import orjson
import pytest

from tests.pipeline.conftest import make_settings

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


@pytest.mark.parametrize("protocol", ["json", "grpc"])
def test_bench_drives_v1_predict(serve, repo_path, defs_path, protocol):
    srv = serve(make_settings(repo_path, defs_path))
    url = srv.http if protocol == "json" else srv.grpc
    body = orjson.dumps({"entities": {"card_id": "b"}, "request": {"amount": 3.0}}).decode()
    out = subprocess.run(
        [sys.executable, "-m", "redline.cli", "bench", "--url", url, "--model", "cards",
         "--protocol", protocol, "--v1", body, "--duration", "0.5", "--warmup", "0", "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["ok"] > 0 and report["errors"] == {}
    stats = srv.call(_stats(srv))
    assert stats["paths"]["primary"] >= report["ok"]


async def _stats(srv):
    return srv.server.pipeline.stats()


def test_bench_v1_refuses_bad_json(serve, repo_path, defs_path):
    out = subprocess.run(
        [sys.executable, "-m", "redline.cli", "bench", "--url", "http://127.0.0.1:9",
         "--model", "cards", "--v1", "{nope", "--duration", "0.1"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0 and "not valid JSON" in out.stderr
