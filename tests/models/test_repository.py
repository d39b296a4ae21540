"""The on-disk repository: every operation, atomicity, integrity."""

from __future__ import annotations

import errno
import json
import os

import pytest

from redline.errors import (
    CorruptModel,
    InvalidInput,
    ModelNotFound,
    RepositoryError,
    VersionNotFound,
)
from redline.models import InferenceSession, ModelRepository, VersionPolicy


def test_add_writes_legible_layout_and_metadata(repo, classifier_onnx, breast_cancer):
    x, _ = breast_cancer
    names = [f"f{i}" for i in range(30)]
    meta = repo.add_onnx(
        "bc",
        classifier_onnx,
        class_labels=[0, 1],
        feature_names=names,
        sample=x,
        metrics={"roc_auc": 0.99},
        framework="scikit-learn",
    )
    folder = repo.root / "bc" / "1"
    assert sorted(p.name for p in folder.iterdir()) == ["metadata.json", "model.onnx"]
    stored = json.loads((folder / "metadata.json").read_text())
    assert stored["version"] == 1 and stored["task"] == "classification"
    assert stored["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 30]}]
    assert {o["name"] for o in stored["outputs"]} == {"label", "probabilities"}
    assert stored["sha256"] == meta.sha256 and len(meta.sha256) == 64
    assert stored["metrics"] == {"roc_auc": 0.99}
    prof = stored["input_profile"]["features"]["f0"]
    assert len(prof["quantiles"]) == 9 and sum(prof["histogram"]["counts"]) == len(x)
    assert stored["created_at"] and stored["missing_values"] == "reject"


def test_metrics_without_a_validation_figure_warn_that_quality_cannot_alarm(
        repo, classifier_onnx):
    from redline.models.repository import RegistrationWarning

    with pytest.warns(RegistrationWarning, match=r"none of the metrics of 'bc' \(f1, "
                      r"roc_auc_train\).*roc_auc, accuracy, log_loss.*can never alarm"):
        repo.add_onnx("bc", classifier_onnx, class_labels=[0, 1],
                      metrics={"f1": 0.8, "roc_auc_train": 0.99})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RegistrationWarning)  # a split suffix is a figure
        meta = repo.add_onnx("bc", classifier_onnx, class_labels=[0, 1],
                             metrics={"roc_auc_holdout": 0.9, "average_precision_holdout": 0.5})
    assert meta.metrics == {"roc_auc_holdout": 0.9, "average_precision_holdout": 0.5}


def test_versions_increment_list_and_resolve(repo, classifier_onnx):
    for _ in range(3):
        repo.add_onnx("bc", classifier_onnx)
    repo.add_onnx("other", classifier_onnx)
    assert repo.list_models() == ["bc", "other"]
    assert repo.versions("bc") == [1, 2, 3]
    assert repo.resolve("bc") == 3 and repo.resolve("bc", "latest") == 3
    assert repo.resolve("bc", "2") == 2 and repo.resolve("bc", 1) == 1
    with pytest.raises(VersionNotFound, match="no version 9"):
        repo.resolve("bc", 9)
    with pytest.raises(VersionNotFound, match="alias 'staging'"):
        repo.resolve("bc", "staging")
    with pytest.raises(ModelNotFound, match="model 'nope' not found.*known models: bc, other"):
        repo.metadata("nope")


def test_explicit_version_conflict(repo, classifier_onnx):
    repo.add_onnx("bc", classifier_onnx, version=5)
    assert repo.versions("bc") == [5]
    with pytest.raises(RepositoryError, match="already has version 5"):
        repo.add_onnx("bc", classifier_onnx, version=5)
    assert repo.add_onnx("bc", classifier_onnx).version == 6


def test_promote_rollback_and_resolution_follow_alias(repo, classifier_onnx):
    for _ in range(3):
        repo.add_onnx("bc", classifier_onnx)
    repo.promote("bc", 1)
    assert repo.resolve("bc") == 1  # production wins over latest
    repo.promote("bc", 2)
    repo.promote("bc", 3)
    assert repo.aliases("bc") == {"production": 3}
    assert repo.rollback("bc") == 2
    assert repo.rollback("bc") == 1
    with pytest.raises(RepositoryError, match="no earlier version"):
        repo.rollback("bc")
    repo.promote("bc", 3, alias="canary")
    assert repo.resolve("bc", "canary") == 3


def test_remove_refuses_aliased_version_unless_forced(repo, classifier_onnx):
    repo.add_onnx("bc", classifier_onnx)
    repo.add_onnx("bc", classifier_onnx)
    repo.promote("bc", 1)
    with pytest.raises(RepositoryError, match="target of alias"):
        repo.remove("bc", 1)
    assert repo.remove("bc", 2) == 2
    assert repo.versions("bc") == [1]
    repo.remove("bc", 1, force=True)
    assert repo.versions("bc") == [] and repo.aliases("bc") == {}
    assert repo.list_models() == []


def test_version_policies_and_live_versions(repo, classifier_onnx):
    for _ in range(4):
        repo.add_onnx("bc", classifier_onnx)
    assert repo.live_versions("bc") == [4]  # default: latest 1
    repo.set_policy("bc", VersionPolicy.latest(2))
    assert repo.live_versions("bc") == [3, 4]
    repo.set_policy("bc", VersionPolicy.specific([1, 3]))
    assert repo.live_versions("bc") == [1, 3]
    repo.set_policy("bc", VersionPolicy.all())
    assert repo.live_versions("bc") == [1, 2, 3, 4]
    repo.set_policy("bc", VersionPolicy.latest(1))
    repo.promote("bc", 2)
    assert repo.live_versions("bc") == [2, 4]  # the production target always stays live
    assert str(VersionPolicy.parse("specific:3,1")) == "specific:1,3"
    with pytest.raises(InvalidInput, match="invalid version policy"):
        VersionPolicy.parse("newest")


def test_interrupted_add_leaves_no_visible_version(repo, classifier_onnx, monkeypatch):
    repo.add_onnx("bc", classifier_onnx)

    def crash(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("redline.models.repository.durable.os.rename", crash)
    with pytest.raises(RepositoryError, match="the disk is full; nothing was added"):
        repo.add_onnx("bc", classifier_onnx)
    monkeypatch.undo()
    assert repo.versions("bc") == [1]
    assert [p.name for p in (repo.root / "bc").iterdir()] == ["1"]  # temporary folder cleaned


def test_writer_killed_mid_add_is_invisible_and_swept(repo, classifier_onnx):
    """A temporary folder left by a dead writer (SIGKILL) is never a version, and is swept."""
    repo.add_onnx("bc", classifier_onnx)
    dead_pid = 2**22 + 12345  # above pid_max's default: no such process
    leftover = repo.root / "bc" / f".tmp-{dead_pid}-deadbeef"
    leftover.mkdir()
    (leftover / "model.onnx").write_bytes(classifier_onnx[:100])
    assert repo.versions("bc") == [1]
    repo.add_onnx("bc", classifier_onnx)
    assert not leftover.exists() and repo.versions("bc") == [1, 2]


def test_corrupt_and_tampered_files_are_refused_with_their_name(repo, classifier_onnx, tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(CorruptModel, match=r"notes\.onnx is not a valid ONNX model"):
        repo.add_onnx("bc", bad)
    with pytest.raises(InvalidInput, match="does not exist"):
        repo.add_onnx("bc", tmp_path / "missing.onnx")
    repo.add_onnx("bc", classifier_onnx)
    path = repo.model_path("bc", 1)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptModel, match=r"bc/1/model\.onnx does not match its recorded sha256"):
        InferenceSession.load(repo, "bc", 1)
    with pytest.raises(CorruptModel, match="sha256"):
        repo.verify("bc", 1)


def test_invalid_names_and_feature_count(repo, classifier_onnx):
    with pytest.raises(InvalidInput, match="invalid model name"):
        repo.add_onnx("../escape", classifier_onnx)
    with pytest.raises(InvalidInput, match="3 feature names given but input 'X' has 30 columns"):
        repo.add_onnx("bc", classifier_onnx, feature_names=["a", "b", "c"])


def test_concurrent_writers_get_distinct_versions(tmp_path, classifier_onnx):
    """Two processes adding at once never overwrite each other (rename refuses a taken number)."""
    import multiprocessing as mp

    root = tmp_path / "models"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_add_many, args=(str(root), classifier_onnx, 5)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert ModelRepository(root).versions("bc") == list(range(1, 11))


def _add_many(root: str, data: bytes, n: int) -> None:
    repo = ModelRepository(root)
    for _ in range(n):
        repo.add_onnx("bc", data)
    os._exit(0)
