"""Pipeline fixtures: feature definitions, a model repository trained on them, real servers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from redline.config import Settings
from redline.features.definitions import load_definitions
from redline.models import ModelRepository
from tests.conftest import keep_drift_thresholds
from tests.serving.helpers import ServerThread

HERE = Path(__file__).parent
PRIMARY_FEATURES = ["card_txn:count_1h", "card_txn:amount_sum_1h", "amount_ratio", "amount",
                    "session:requests"]


def train_models(root: Path, defs_path: Path) -> ModelRepository:
    """``cards`` (primary, pinned to the view versions) and ``cards_small`` (its fallback)."""
    from sklearn.linear_model import LogisticRegression

    defs = load_definitions(defs_path)
    rng = np.random.default_rng(0)
    x = rng.random((400, len(PRIMARY_FEATURES))).astype(np.float32) * [5, 500, 3, 200, 4]
    y = (x[:, 2] > 1.5).astype(int)
    repo = ModelRepository(root)
    repo.add_estimator("cards", LogisticRegression(max_iter=500).fit(x, y), x,
                       feature_names=PRIMARY_FEATURES, feature_views=defs.versions())
    small = x[:, [3]]
    repo.add_estimator("cards_small", LogisticRegression().fit(small, y), small,
                       feature_names=["amount"])
    return repo


@pytest.fixture(scope="session")
def defs_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("defs") / "defs_cards.py"
    shutil.copy(HERE / "defs_cards.py", path)
    return path


@pytest.fixture(scope="session")
def trained_repo(tmp_path_factory: pytest.TempPathFactory, defs_path: Path) -> Path:
    root = tmp_path_factory.mktemp("models")
    train_models(root, defs_path)
    keep_drift_thresholds(root)  # each test's server reads them instead of calibrating
    return root


@pytest.fixture
def repo_path(tmp_path: Path, trained_repo: Path) -> Path:
    """A private copy of the trained repository (tests may add versions)."""
    dest = tmp_path / "models"
    shutil.copytree(trained_repo, dest)
    return dest


def make_settings(repo: Path, defs: Path, *, store: str = "memory", redis_url: str = "",
                  **cache: Any) -> Settings:
    s = Settings()
    s.repository = str(repo)
    s.server.http_port = 0
    s.server.grpc_port = 0
    s.server.watch_repository = False
    s.features.definitions = str(defs)
    s.features.store = store
    if redis_url:
        s.features.redis_url = redis_url
    for key, value in cache.items():
        setattr(s.cache, key, value)
    s.runtime.warmup_batch_sizes = [1]
    s.runtime.warmup_runs = 1
    return s


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(settings)`` starts a server thread; all are stopped at teardown."""
    started: list[ServerThread] = []

    def start(settings: Settings) -> ServerThread:
        srv = ServerThread(settings).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="module", params=["memory", "redis"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           trained_repo: Path, defs_path: Path) -> Iterator[ServerThread]:
    """A server of the trained models, once on the memory store and once on a real Redis,
    shared by a module's tests: each test reads and writes its own entities."""
    repo = tmp_path_factory.mktemp("models") / "models"
    shutil.copytree(trained_repo, repo)
    if request.param == "redis":
        redis_server = request.getfixturevalue("redis_server_module")
        settings = make_settings(repo, defs_path, store="redis", redis_url=redis_server.url)
    else:
        settings = make_settings(repo, defs_path)
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()
