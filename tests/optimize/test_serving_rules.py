"""What a registered candidate does to serving: nothing until promoted, and once served it runs
with the runtime settings it won with (checked on the session the server really loads)."""

from __future__ import annotations

import asyncio

import onnxruntime as ort
import pytest

from redline.config import Settings


def _registry_default(repo, name: str) -> tuple[int, object]:
    from redline.serving.registry import ModelRegistry

    async def load() -> tuple[int, object]:
        registry = ModelRegistry(repo, Settings())
        await registry.sync()
        handle = registry.get(name)
        loaded = [h.session.metadata.version for h in registry.loaded(name)]
        await registry.close()
        return handle.session.metadata.version, (handle, loaded)

    return asyncio.run(load())


def test_a_candidate_does_not_serve_until_promoted(repo, digits, digits_mlp):
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])  # v1, no production alias
    data = repo.model_path("digits", 1).read_bytes()
    repo.add_onnx("digits", data, class_labels=list(range(10)), requires_promotion=True)  # v2
    assert repo.resolve("digits", None) == 1  # what optimize works from, and what serves
    assert repo.live_versions("digits") == [1]  # a latest:1 policy does not load it
    version, (_, loaded) = _registry_default(repo, "digits")
    assert version == 1 and loaded == [1]
    assert repo.resolve("digits", "latest") == 2  # still reachable when named

    repo.promote("digits", 2)
    assert repo.resolve("digits", None) == 2
    version, _ = _registry_default(repo, "digits")
    assert version == 2
    repo.promote("digits", 1)  # rolled forward to 1 again: 2 stays servable by name
    assert 2 in repo.servable_versions("digits")


def test_an_ordinary_new_version_still_serves_as_before(repo, digits, digits_mlp):
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    assert repo.resolve("digits", None) == 2 and repo.live_versions("digits") == [2]


@pytest.mark.parametrize("level,threads", [("disable", 2), ("basic", 1)])
def test_the_server_applies_a_versions_runtime_settings(repo, digits, digits_mlp, level,
                                                        threads):
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    data = repo.model_path("digits", 1).read_bytes()
    repo.add_onnx("digits", data, class_labels=list(range(10)),
                  extra={"runtime": {"graph_optimization": level, "intra_op_threads": threads}})
    _, (handle, _) = _registry_default(repo, "digits")
    options = handle.session.session_options
    expected = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[level]
    assert options.graph_optimization_level == expected
    assert options.intra_op_num_threads == threads
    assert Settings().runtime.graph_optimization == "all"  # the configured default differs
