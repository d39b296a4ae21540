"""Monitoring keeps a sample of requests' arrays in time, not every request's (cost), yet every
request with an id (a label may join it) and every request of a shadowed version."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from redline.config import Settings
from redline.models import ModelRepository
from redline.serving.registry import ModelRegistry
from redline.serving.stages import RequestRecord
from tests.serving.helpers import affine_model


def _registry(tmp_path: Path, rows_per_s: float) -> ModelRegistry:
    settings = Settings()
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    settings.monitoring.enabled = True
    settings.monitoring.window_rows_per_s = rows_per_s
    model = tmp_path / "affine.onnx"
    model.write_bytes(affine_model())
    repository = ModelRepository(tmp_path / "repo")
    repository.add_onnx("affine", model)
    settings.repository = str(tmp_path / "repo")
    return ModelRegistry(repository, settings)


async def _run(registry: ModelRegistry, n: int, request_id: str = "") -> tuple[int, float]:
    await registry.sync()
    handle = registry.get("affine")
    x = {"x": np.ones((1, 4), dtype=np.float32)}
    kept = 0
    t0 = time.monotonic()
    for _ in range(n):
        record = RequestRecord("v2", "rest")
        record.request_id = request_id
        out = await handle.infer(x, record=record)
        assert np.allclose(out["y"], 2.0)  # the answer never depends on the sample
        kept += record.inputs is not None and record.outputs is not None
    return kept, time.monotonic() - t0


def test_a_sample_in_time_at_the_windows_rate(tmp_path: Path) -> None:
    kept, elapsed = asyncio.run(_run(_registry(tmp_path, rows_per_s=100.0), 2000))
    # One record every 10 ms carries its arrays: far fewer than 2,000, never none.
    assert 1 <= kept <= elapsed * 100 + 2, (kept, elapsed)


def test_requests_with_an_id_always_keep_their_arrays(tmp_path: Path) -> None:
    kept, _ = asyncio.run(_run(_registry(tmp_path, rows_per_s=100.0), 300, request_id="r"))
    assert kept == 300


def test_a_shadowed_version_keeps_every_request(tmp_path: Path) -> None:
    registry = _registry(tmp_path, rows_per_s=100.0)

    async def shadowed() -> tuple[int, float]:
        await registry.sync()
        registry.get("affine").keep_every_request(True)
        return await _run(registry, 300)

    kept, _ = asyncio.run(shadowed())
    assert kept == 300
