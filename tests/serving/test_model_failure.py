"""A model that raises at run time: a clear 500 ``model_failed``, one ERROR line, no traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from redline.config import Settings
from redline.models import ModelRepository
from tests.scaling.models import failing_affine
from tests.serving.helpers import ServerThread

pytestmark = pytest.mark.slow  # starts a server

FAILS = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [5, 5, 5, 5]}]}
PASSES = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    repo = ModelRepository(tmp_path_factory.mktemp("failing"))
    repo.add_onnx("broken", failing_affine())
    settings = Settings()
    settings.server.grpc_enabled = False
    settings.server.watch_repository = False
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    served = ServerThread(settings, repo).start()
    yield served
    served.stop()


@pytest.mark.allow_log(r"model 'broken(:1)?' failed to run")
def test_a_failing_model_is_a_500_naming_it_and_one_log_line(
        server: ServerThread, caplog: pytest.LogCaptureFixture) -> None:
    with httpx.Client(base_url=server.http, timeout=10) as client:
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            r = client.post("/v2/models/broken/infer", json=FAILS)
        assert r.status_code == 500
        doc = r.json()
        assert doc["code"] == "model_failed"
        assert "model 'broken" in doc["error"] and "failed to run" in doc["error"]
        assert "Gather" in doc["error"]  # the model's own reason, in one line
        assert "Traceback" not in r.text
        errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
        assert len(errors) == 1, [rec.getMessage() for rec in errors]
        line = errors[0]
        assert "broken" in line.getMessage() and "Gather" in line.getMessage()
        assert line.exc_info is None and "\n" not in line.getMessage().strip()
        # The server keeps serving inputs the model can run.
        ok = client.post("/v2/models/broken/infer", json=PASSES)
        assert ok.status_code == 200, ok.text
