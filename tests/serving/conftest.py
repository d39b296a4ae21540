"""One real server (REST + gRPC on ephemeral ports) shared by the protocol tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from redline.config import ModelSettings, Settings
from tests.serving.helpers import ServerThread, make_repository

ADMIN_TOKEN = "s3cret-token"
MAX_BODY = 256 * 1024


@pytest.fixture(scope="package")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    repo = make_repository(tmp_path_factory.mktemp("repo"))
    settings = Settings()
    settings.server.max_body_bytes = MAX_BODY
    settings.server.admin_enabled = True
    settings.server.admin_token = ADMIN_TOKEN
    settings.server.watch_repository = False
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    settings.models["slow"] = ModelSettings(slo_ms=5000)
    server = ServerThread(settings, repo).start()
    yield server
    server.stop()
