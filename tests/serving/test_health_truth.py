"""Health tells the truth (docs/operations.md#health): per-model readiness follows what is loaded,
the metadata's ``versions`` are the servable ones, the admin index says UNLOADED for versions
left out on purpose, and an unreachable online store is logged and shown as degraded while the
server stays ready."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest

from redline.config import Settings
from redline.models import ModelRepository, VersionPolicy
from tests.serving.helpers import ServerThread, affine_model

ROOT = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": "Bearer t"}


def settings() -> Settings:
    s = Settings()
    s.runtime.warmup_batch_sizes = [1]
    s.runtime.warmup_runs = 1
    s.server.watch_repository = False
    s.server.admin_enabled = True
    s.server.admin_token = "t"
    s.server.grpc_enabled = False
    return s


def test_versions_index_and_readiness(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("m", affine_model(scale=1.0))
    repo.add_onnx("m", affine_model(scale=2.0))
    repo.add_onnx("other", affine_model(scale=3.0))
    repo.set_policy("m", VersionPolicy.parse("latest:1"))
    server = ServerThread(settings(), repo).start()
    try:
        with httpx.Client(base_url=server.http, timeout=10) as c:
            # Version 1 is outside the policy: not servable, so not listed, and UNLOADED
            assert c.get("/v2/models/m").json()["versions"] == ["2"]
            index = {(r["name"], r["version"]): r for r in c.post("/v2/repository/index",
                                                                  headers=AUTH).json()}
            assert index[("m", "1")]["state"] == "UNLOADED"
            assert "policy" in index[("m", "1")]["reason"]
            assert index[("m", "2")]["state"] == "READY"
            # An unloaded model is not ready; the server serves the others and stays ready
            assert c.post("/v2/repository/models/m/unload", headers=AUTH).status_code == 200
            assert c.get("/v2/models/m/ready").status_code == 503
            assert c.get("/v2/models/m/versions/2/ready").status_code == 503
            assert c.get("/v2/models/other/ready").status_code == 200
            assert c.get("/v2/health/ready").status_code == 200
            index = {(r["name"], r["version"]): r for r in c.post("/v2/repository/index",
                                                                  headers=AUTH).json()}
            assert index[("m", "2")]["state"] == "UNLOADED"
            assert c.post("/v2/repository/models/m/load", headers=AUTH).status_code == 200
            assert c.get("/v2/models/m/ready").status_code == 200
    finally:
        server.stop()


def wait_for(check, seconds: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_unreachable_store_is_logged_and_degraded_but_ready(
        tmp_path: Path, redis_server, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="redline.serving")
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("m", affine_model())
    s = settings()
    s.features.definitions = str(ROOT / "examples" / "fraud" / "features.py")
    s.features.store = "redis"
    s.features.redis_url = redis_server.url
    redis_server.kill()  # down before the server starts: logged at start
    server = ServerThread(s, repo).start()
    try:
        with httpx.Client(base_url=server.http, timeout=10) as c:
            r = c.get("/v2/health/ready")
            assert r.status_code == 200  # a Redis outage must not empty the load balancer
            doc = r.json()
            assert doc["ready"] is True and doc["degraded"] is True
            assert doc["online_store"]["reachable"] is False
            assert any("unreachable" in m for m in caplog.messages)
            redis_server.restart()  # every change is logged and shown
            assert wait_for(lambda: c.get("/v2/health/ready").json()["degraded"] is False)
            assert any("reachable again" in m for m in caplog.messages)
            redis_server.kill()
            assert wait_for(lambda: c.get("/v2/health/ready").json()["degraded"] is True)
            assert sum("unreachable" in m for m in caplog.messages) == 2
            assert c.get("/v2/health/ready").status_code == 200
    finally:
        server.stop()


def _broken_and_healthy(tmp_path: Path) -> ModelRepository:
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("good", affine_model(scale=1.0))
    repo.add_onnx("broken", affine_model(scale=2.0))
    model_file = repo.version_dir("broken", 1) / "model.onnx"
    model_file.write_bytes(model_file.read_bytes()[:-16] + b"\0" * 16)  # sha256 no longer matches
    return repo


@pytest.mark.allow_log(r"model broken is not ready: version 1: model file .* does not match")
@pytest.mark.parametrize("strict", [True, False])
def test_a_model_that_cannot_load_is_named_with_why_and_the_fix(
        tmp_path: Path, strict: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Strict readiness: not ready while one model cannot load, and the body and the log say
    which and why; without it the server is ready and serves the models that loaded."""
    caplog.set_level(logging.INFO, logger="redline.serving")
    s = settings()
    s.server.strict_readiness = strict
    s.server.grpc_enabled = True
    server = ServerThread(s, _broken_and_healthy(tmp_path)).start()
    try:
        with httpx.Client(base_url=server.http, timeout=10) as c:
            r = c.get("/v2/health/ready")
            assert r.status_code == (503 if strict else 200), r.text
            doc = r.json()
            assert doc["ready"] is (not strict)
            [problem] = doc["models_not_ready"]
            assert problem["model"] == "broken" and problem["state"] == "UNAVAILABLE"
            assert "version 1" in problem["reason"] and "sha256" in problem["reason"]
            assert "redline models add -m broken" in problem["fix"]
            assert "strict_readiness" in problem["fix"]
            assert c.get("/v2/models/good/ready").status_code == 200
            assert c.get("/v2/models/broken/ready").status_code == 503
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.server.grpc_port}")
        assert client.is_server_ready() is (not strict)
        client.close()
    finally:
        server.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    named = [m for m in errors if m.startswith("model broken is not ready")]
    assert len(named) == 1 and "sha256" in named[0] and "To fix:" in named[0]
    assert ". ." not in named[0] and ".." not in named[0].replace("...", "")  # one full stop
