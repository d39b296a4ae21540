"""Python models in the repository: the format ``add`` writes, what it refuses, and the runner.

``add`` runs the sample in a real worker process, so every refusal here is the one a user sees.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from redline.errors import CorruptModel, InvalidInput, ModelError
from redline.models import ModelRepository, PythonSession, load_runner
from redline.models.python.session import FailureLog
from redline.models.repository import RegistrationWarning
from tests.models import pymodels as pm

pytestmark = pytest.mark.slow  # starts worker processes


@pytest.fixture()
def repo(tmp_path: Path) -> ModelRepository:
    return ModelRepository(tmp_path / "models")


def add(repo: ModelRepository, tmp_path: Path, source: str, sample: np.ndarray | None = None,
        name: str = "m", **kwargs: object):
    path = pm.write(tmp_path / f"src-{name}", source)
    return repo.add_python(name, path, pm.rows() if sample is None else sample,
                           trust_code=True, **kwargs)


# ---------------------------------------------------------------------- the format
def test_add_writes_model_py_its_signature_and_sample(repo, tmp_path):
    meta = add(repo, tmp_path, pm.ROW_SUM, name="rowsum")
    folder = repo.version_dir("rowsum", 1)
    assert sorted(p.name for p in folder.iterdir()) == ["metadata.json", "model.py",
                                                        "sample.npz"]
    doc = json.loads((folder / "metadata.json").read_text())
    assert doc["framework"] == "python"
    assert doc["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}]
    assert doc["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}]
    assert set(doc["extra"]["python"]["files"]) == {"model.py", "sample.npz"}
    assert doc["sha256"] == doc["extra"]["python"]["files"]["model.py"] == meta.sha256
    assert doc["extra"]["python"]["class"] == "Model"
    assert repo.is_python("rowsum", 1) and repo.verify("rowsum").version == 1
    with np.load(folder / "sample.npz") as sample:
        assert sample["INPUT0"].shape == (8, 16)
    with pytest.raises(InvalidInput, match="Python model"):
        repo.model_path("rowsum", 1)


def test_a_folder_model_with_weights_a_module_and_strings(repo, tmp_path):
    src = pm.folder_model(tmp_path / "scorer")
    (src / "requirements.txt").write_text("# what it needs\nnumpy>=1.26\n")
    sample = {"x": np.eye(3, dtype=np.float32), "tag": np.array(["a", "b", "c"], dtype=object)}
    meta = repo.add_python("scorer", src, sample, trust_code=True, runtime="process")
    assert meta.inputs[0].datatype == "FP32" and meta.inputs[0].shape == [-1, 3]
    info = meta.extra["python"]
    assert info["class"] == "Scorer" and info["runtime"] == "process"
    assert info["requirements"] == ["numpy>=1.26"]
    assert {"model.py", "scaling.py", "weights.npy", "sample.npz"} <= set(info["files"])
    session = load_runner(repo, "scorer", python_runtime="thread")
    try:
        out = session.run(session.validate(sample))
        assert out["score"].tolist() == [2.0, 4.0, 6.0]
        assert out["label"].tolist() == ["a:2.0", "b:4.0", "c:6.0"]
        assert session.example_inputs(5)["tag"].tolist() == ["a", "b", "c", "a", "b"]
    finally:
        session.close()


def test_a_version_holds_only_its_files_where_python_writes_bytecode(repo, tmp_path,
                                                                     monkeypatch):
    """Importing model.py and its siblings (at add, in a worker process, and at load) writes
    no ``__pycache__`` into the folder: a version keeps the files its checksums record."""
    import sys

    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # (workers inherit it)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    src = pm.folder_model(tmp_path / "scorer")
    # a subpackage too, imported relatively from a sibling
    (src / "scaling.py").write_text("from .helpers.factor import FACTOR\n\n\n"
                                    "def scale(v):\n    return v * FACTOR\n")
    (src / "helpers").mkdir()
    (src / "helpers" / "__init__.py").write_text("")
    (src / "helpers" / "factor.py").write_text("FACTOR = 2\n")
    sample = {"x": np.eye(3, dtype=np.float32), "tag": np.array(["a", "b", "c"], dtype=object)}
    for runtime in ("process", "thread"):
        meta = repo.add_python(f"scorer-{runtime}", src, sample, trust_code=True,
                               runtime=runtime)
        folder = repo.version_dir(meta.name, 1)
        session = load_runner(repo, meta.name, python_runtime=runtime)
        try:
            assert session.run(session.validate(sample))["score"].tolist() == [2.0, 4.0, 6.0]
        finally:
            session.close()
        held = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
        assert held == set(meta.extra["python"]["files"]) | {"metadata.json"}, held
        assert repo.verify(meta.name).version == 1


def test_signature_given_to_add_wins_over_none_declared(repo, tmp_path):
    meta = add(repo, tmp_path, pm.NO_SIGNATURE, inputs={"INPUT0": ("FP32", [-1, 16])},
               outputs=[{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}])
    assert [o.name for o in meta.outputs] == ["OUTPUT0"]


# ---------------------------------------------------------------------- refusals at add
def test_add_without_trust_is_refused_saying_the_code_runs(repo, tmp_path):
    path = pm.write(tmp_path / "src", pm.ROW_SUM)
    with pytest.raises(InvalidInput, match="whatever code it holds runs"):
        repo.add_python("m", path, pm.rows())
    assert repo.list_models() == []


@pytest.mark.parametrize("source, message, marker", [
    (pm.SYNTAX_ERROR, r"cannot import .*model\.py: SyntaxError: expected ':' \(model\.py, line "
                      r"{line}\)", "def predict(self, inputs)"),
    (pm.IMPORT_ERROR, r"No module named 'redline_no_such_package' \(model\.py, line {line}\); "
                      r"install 'redline_no_such_package' where redline runs",
     "import redline_no_such_package"),
    (pm.WRONG_DTYPE, r"output 'OUTPUT0' is float64 but the signature declares FP32", None),
    (pm.WRONG_SHAPE, r"output 'OUTPUT0' has shape \[1\] for 8 input row\(s\)", None),
    (pm.NAN, r"output 'OUTPUT0' holds NaN or infinity \(first at row 0\)", None),
    (pm.MISSING, r"predict returned outputs \['OUT'\] but the signature declares \['OUTPUT0'\] "
                 r"\(no 'OUTPUT0'; undeclared 'OUT'\)", None),
    (pm.NOT_A_DICT, r"predict returned ndarray, not a dict", None),
])
def test_a_broken_model_is_refused_with_its_file_and_line(repo, tmp_path, source, message,
                                                          marker):
    if marker is not None:
        text = (pm.HEADER + source.lstrip()).splitlines()
        message = message.replace("{line}", str(1 + next(
            i for i, line in enumerate(text) if marker in line)))
    with pytest.raises(ModelError, match=message) as caught:
        add(repo, tmp_path, source)
    assert caught.value.code == "model_error" and caught.value.http_status == 500
    assert repo.list_models() == []


def test_predict_raising_on_some_rows_is_refused_naming_the_line(repo, tmp_path):
    sample = pm.rows()
    sample[5, 0] = 13
    with pytest.raises(ModelError, match=r"on the sample, predict raised ValueError: unlucky "
                                         r"row 5 \(model\.py, line \d+\)") as caught:
        add(repo, tmp_path, pm.MOODY, sample)
    assert "Traceback" in caught.value.details["traceback"]
    assert "raise ValueError" in caught.value.details["traceback"]


def test_a_hang_is_stopped_at_the_timeout_and_refused(repo, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(ModelError, match=r"predict did not finish within 2 s"):
        add(repo, tmp_path, pm.HANGS, timeout_s=2)
    assert time.monotonic() - t0 < 20


def test_a_crash_is_refused(repo, tmp_path):
    with pytest.raises(ModelError, match=r"worker process exited with code 3"):
        add(repo, tmp_path, pm.MOODY, pm.rows(first=-5))


def test_no_signature_or_a_bad_one_is_refused(repo, tmp_path):
    with pytest.raises(InvalidInput, match="declare the model's signature"):
        add(repo, tmp_path, pm.NO_SIGNATURE)
    bad = pm.ROW_SUM.replace('("FP32", [-1])', '("FP32", [4])')
    with pytest.raises(InvalidInput, match=r"must start with -1: the first dimension is the rows"):
        add(repo, tmp_path, bad, name="bad")


def test_a_sample_that_does_not_fit_the_signature_is_refused(repo, tmp_path):
    with pytest.raises(InvalidInput, match=r"the sample does not match.*has 3 along axis 1"):
        add(repo, tmp_path, pm.ROW_SUM, np.zeros((4, 3), np.float32))


def test_rows_that_depend_on_each_other_warn(repo, tmp_path):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        add(repo, tmp_path, pm.BATCH_DEPENDENT)
    notes = [str(w.message) for w in said if issubclass(w.category, RegistrationWarning)]
    assert len(notes) == 1 and "differ from the same row run with the whole sample" in notes[0]


# ---------------------------------------------------------------------- the runner
@pytest.mark.allow_log(r"model 'm' version 1: (predict raised|model.py broke)")
def test_in_process_runner_checks_every_answer(repo, tmp_path, caplog):
    add(repo, tmp_path, pm.MOODY)
    session = load_runner(repo, "m")
    assert isinstance(session, PythonSession) and session.user_code
    assert session.worker_threads > 1 and session.providers == ["python (thread)"]
    ok = session.run({"INPUT0": pm.rows(3)})["OUTPUT0"]
    assert ok.dtype == np.float32 and ok.shape == (3,)
    with caplog.at_level(logging.ERROR, logger="redline.models"):
        for _ in range(3):
            with pytest.raises(ModelError, match=r"model 'm' version 1: predict raised "
                                                 r"ValueError: unlucky row 0 \(model.py, line"):
                session.run({"INPUT0": pm.rows(2, first=13)})
        with pytest.raises(ModelError, match=r"broke its signature: output 'OUTPUT0' holds NaN"):
            session.run({"INPUT0": pm.rows(2, first=7)})
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # each kind of failure once, the first with its traceback; the repeats are not logged
    assert len(logged) == 2, logged
    assert "Traceback (most recent call last)" in logged[0] and "raise ValueError" in logged[0]
    assert "holds NaN" in logged[1]
    session.close()


@pytest.mark.allow_log(r"it failed")
def test_failure_log_repeats_at_most_once_an_interval(caplog):
    failures = FailureLog(interval_s=0.2)
    with caplog.at_level(logging.ERROR, logger="redline.models"):
        for _ in range(50):
            failures("k", "it failed", "Traceback (most recent call last):\n  boom")
        time.sleep(0.25)
        failures("k", "it failed again")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "boom" in lines[0]
    assert "50 failure(s) of this model since the last one logged" in lines[1]


def test_a_changed_file_is_refused_at_load(repo, tmp_path):
    add(repo, tmp_path, pm.ROW_SUM)
    path = repo.version_dir("m", 1) / "model.py"
    path.write_text(path.read_text() + "\n# edited\n")
    with pytest.raises(CorruptModel, match="does not match its recorded sha256"):
        load_runner(repo, "m")
    with pytest.raises(CorruptModel):
        repo.verify("m")


def test_two_versions_loaded_side_by_side_keep_their_own_code(repo, tmp_path):
    add(repo, tmp_path, pm.ROW_SUM)
    add(repo, tmp_path, pm.row_sum(factor=2), name="m2")
    src = tmp_path / "src-m2" / "model.py"
    repo.add_python("m", src, pm.rows(), trust_code=True)
    one, two = load_runner(repo, "m", 1), load_runner(repo, "m", 2)
    x = np.ones((1, 16), np.float32)
    assert one.run({"INPUT0": x})["OUTPUT0"][0] == 16
    assert two.run({"INPUT0": x})["OUTPUT0"][0] == 32
    one.close()
    assert two.run({"INPUT0": x})["OUTPUT0"][0] == 32
    two.close()


# ---------------------------------------------------------------------- runtime: process
@pytest.mark.allow_log(r"model 'm' version 1: (predict raised|the model's worker process)")
def test_process_runner_answers_replaces_a_crashed_worker_and_stops_a_hang(repo, tmp_path,
                                                                          caplog):
    add(repo, tmp_path, pm.MOODY)
    session = load_runner(repo, "m", python_runtime="process", python_workers=2)
    try:
        assert session.providers == ["python (process)"] and session.concurrent_runs == 2
        x = pm.rows(1000)
        assert np.allclose(session.run({"INPUT0": x})["OUTPUT0"], x.sum(axis=1), rtol=1e-6)
        with caplog.at_level(logging.ERROR, logger="redline.models"):
            with pytest.raises(ModelError, match=r"unlucky row 1 \(model.py, line"):
                session.run({"INPUT0": np.concatenate([pm.rows(1), pm.rows(1, first=13)])})
            with pytest.raises(ModelError, match=r"worker process exited with code 3"):
                session.run({"INPUT0": pm.rows(1, first=-5)})
        assert "Traceback" in caplog.records[0].getMessage()
        assert session.run({"INPUT0": pm.rows(2)})["OUTPUT0"].shape == (2,)  # replaced
        # A hang: the server abandons the run (its requests' budgets ran out); the worker is
        # stopped and replaced, and the other worker answers meanwhile.
        failed: list[BaseException] = []

        def hang() -> None:
            try:
                session.run({"INPUT0": pm.rows(1, first=99)})
            except ModelError as exc:
                failed.append(exc)

        thread = threading.Thread(target=hang)
        thread.start()
        time.sleep(1.0)
        assert session.run({"INPUT0": pm.rows(2)})["OUTPUT0"].shape == (2,)
        session.abandon(thread.ident or 0)
        thread.join(30)
        assert failed and "killed by signal" in str(failed[0])
        deadline = time.monotonic() + 30
        while session._pool is not None and session._pool.size < 2:  # noqa: SLF001
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        session.close()
