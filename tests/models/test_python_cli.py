"""`redline models add -m NAME model.py --sample ROWS --trust-code`, and `redline predict` of it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from redline.models import ModelRepository
from tests.models import pymodels as pm
from tests.models.cli import run

pytestmark = pytest.mark.slow  # worker processes


def test_add_refuses_without_trust_then_adds_and_predicts(capsys, tmp_path) -> None:
    source = pm.write(tmp_path / "src", pm.ROW_SUM)
    np.save(tmp_path / "rows.npy", pm.rows(8))
    repo = str(tmp_path / "repo")
    code, _, err = run(capsys, "models", "add", "-m", "rowsum", str(source), "--sample",
                       str(tmp_path / "rows.npy"), "-r", repo)
    assert code == 2 and "whatever code it holds runs" in err and "--trust-code" in err
    code, _, err = run(capsys, "models", "add", "-m", "rowsum", str(source), "-r", repo,
                       "--trust-code")
    assert code == 2 and "needs --sample" in err
    code, out, err = run(capsys, "models", "add", "-m", "rowsum", str(source), "--sample",
                         str(tmp_path / "rows.npy"), "-r", repo, "--trust-code",
                         "--runtime", "process")
    assert code == 0, err
    assert "added rowsum version 1 (python" in out
    assert ModelRepository(repo).metadata("rowsum").extra["python"]["runtime"] == "process"
    row = list(range(16))
    code, out, err = run(capsys, "predict", "-m", "rowsum", "-r", repo, "-i", json.dumps([row]))
    assert code == 0, err
    assert json.loads(out)["outputs"] == {"OUTPUT0": [float(sum(row))]}


def test_a_model_that_breaks_on_the_sample_is_refused_with_its_traceback(capsys,
                                                                         tmp_path) -> None:
    source = pm.write(tmp_path / "src", pm.MOODY)
    sample = pm.rows(8)
    sample[3, 0] = 13
    np.savez(tmp_path / "sample.npz", INPUT0=sample)
    code, _, err = run(capsys, "models", "add", "-m", "moody", str(source), "--sample",
                       str(tmp_path / "sample.npz"), "-r", str(tmp_path / "repo"),
                       "--trust-code")
    assert code != 0
    assert "Traceback (most recent call last)" in err and 'raise ValueError(f"unlucky' in err
    assert "error [model_error]" in err and "unlucky row 3 (model.py, line" in err
    np.save(tmp_path / "nan.npy", pm.rows(4, first=7))
    code, _, err = run(capsys, "models", "add", "-m", "moody", str(source), "--sample",
                       str(tmp_path / "nan.npy"), "-r", str(tmp_path / "repo"), "--trust-code")
    assert code != 0 and "broke its signature: output 'OUTPUT0' holds NaN" in err
    assert ModelRepository(tmp_path / "repo").list_models() == []
