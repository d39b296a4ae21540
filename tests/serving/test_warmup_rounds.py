"""The request-path warm-up repeats a body only while repeating is worth it: a fast model's
bodies are sent ``ROUNDS`` times (the interpreter specializes the path after ~8 calls), a body
slower than ``SLOW_WARMUP_S`` once (its own run dwarfs a cold path, and thirty runs of a heavy
model held a two-worker server's start-up for 13.5 s)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from redline.config import Settings
from redline.models import ModelRepository
from redline.serving import warmup
from redline.serving.app import RestApp
from tests.serving.helpers import ServerThread, affine_model, slow_model

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def test_a_slow_models_bodies_are_sent_once_a_fast_models_repeated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    repo.add_onnx("heavy", slow_model(layers=200))  # hundreds of ms a run
    sent: Counter[str] = Counter()
    inline = RestApp.infer_inline

    def counted(self: RestApp, path: str, *args: Any) -> Any:
        sent[path.split("/")[3]] += 1  # /v2/models/{name}/infer
        return inline(self, path, *args)

    monkeypatch.setattr(RestApp, "infer_inline", counted)
    settings = Settings()
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    settings.server.watch_repository = False
    settings.monitoring.enabled = False
    server = ServerThread(settings, repo).start()
    try:
        registry = server.server.registry
        bodies = {name: len(warmup._requests(name, registry.get(name), None, settings))
                  for name in ("affine", "heavy")}
        assert bodies["heavy"] >= 2  # V2 JSON through the fast and the general path (binary too)
        assert sent["heavy"] == bodies["heavy"]  # each of its bodies once
        # repeated (ROUNDS times, unless a send stalled)
        assert bodies["affine"] < sent["affine"] <= bodies["affine"] * warmup.ROUNDS
    finally:
        server.stop()
