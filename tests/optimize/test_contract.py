"""A candidate keeps the original's contract (inputs, outputs, missing-value policy) or is not a
candidate, and the report shows that contract; its change columns say which way is better and
never print NaN for rows that hold NaN."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from redline.optimize import OptimizeOptions, optimize
from redline.optimize import optimizer as optimizer_module
from redline.optimize.candidates import Candidate
from redline.optimize.distill import distill_candidates
from redline.optimize.profile import Outputs, compare_outputs
from redline.optimize.report import to_markdown
from tests.optimize.conftest import run_cli

QUICK = ["--fast", "--rounds", "20", "--passes", "2", "--bootstrap", "100"]


@pytest.fixture()
def boosted(repo, cancer):
    """A histogram gradient-boosting model, which answers rows with missing values itself."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    x = cancer.x_train.copy()
    x[::9, 3] = np.nan
    model = HistGradientBoostingClassifier(max_iter=20, max_depth=3, random_state=0).fit(
        x, cancer.y_train)
    repo.add_estimator("cancer", model, cancer.x_train[:64])
    repo.promote("cancer", 1)
    assert repo.metadata("cancer").missing_values == "allow"
    return repo


def test_a_student_of_a_model_that_allows_missing_values_is_not_a_candidate(
        boosted, cancer, tmp_path, capsys):
    data = tmp_path / "val.npz"
    np.savez(data, X=np.concatenate([cancer.x_train, cancer.x_val]),
             y=np.concatenate([cancer.y_train, cancer.y_val]))  # no NaN in these rows
    code, out, err = run_cli(["optimize", "-m", "cancer", "--data", data, "-r", boosted.root,
                              "--techniques", "trees,distill", "--min-speedup", "0", "--json",
                              *QUICK], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert all(c["technique"] != "distill" for c in report["candidates"])
    skipped = {s["name"]: s["reason"] for s in report["skipped"]}
    assert "break the original's contract" in skipped["distill"]
    assert report["contract"]["missing_values"] == "allow"
    assert [i["name"] for i in report["contract"]["inputs"]] == ["input"]
    words = " ".join(err.split())  # the intro wraps at the terminal's width
    assert "Contract every candidate keeps:" in words and "missing values: allow" in words
    if report["registered"]:
        version = report["registered"]["version"]
        assert boosted.metadata("cancer", version).missing_values == "allow"


def test_a_candidate_that_answers_nan_where_the_original_answers_is_rejected(
        boosted, cancer, monkeypatch):
    """Whatever made it: a student built anyway is caught by the contract probe, even when no
    evaluation row holds a missing value."""
    model = boosted.model_path("cancer", 1).read_bytes()

    def student_anyway(data, ctx):
        ctx.missing_values = "reject"  # as if the technique ignored the policy
        yield from distill_candidates(data, ctx)
        ctx.missing_values = "allow"

    monkeypatch.setitem(optimizer_module.TECHNIQUES, "student", student_anyway)
    x = np.concatenate([cancer.x_train, cancer.x_val])
    y = np.concatenate([cancer.y_train, cancer.y_val])
    report = optimize(model, x, y, task="classification", class_labels=[0, 1],
                      missing_values="allow",
                      options=OptimizeOptions(techniques=["student"], fast=True, rounds=20,
                                              passes=2, bootstrap=100))
    reasons = {s.name: s.reason for s in report.rejected}
    assert "breaks the original's contract: missing values allow -> reject" in \
        reasons["distill-mlp-32"]
    assert [r.name for r in report.results] == ["original"]


def _shifted_regressor(model: bytes, by: float) -> bytes:
    """The same regressor with ``by`` added to every answer."""
    proto = onnx.load_from_string(model)
    out = proto.graph.output[0]
    inner = f"{out.name}_unshifted"
    for node in proto.graph.node:
        node.output[:] = [inner if o == out.name else o for o in node.output]
    proto.graph.initializer.append(
        onnx.numpy_helper.from_array(np.asarray([by], dtype=np.float32), "shift"))
    proto.graph.node.append(helper.make_node("Add", [inner, "shift"], [out.name]))
    return proto.SerializeToString()


def test_change_columns_are_signed_with_their_direction_and_nan_rows_compare_equal(
        monkeypatch):
    from sklearn.linear_model import LinearRegression

    from redline.models.convert import convert

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4)).astype(np.float32)
    y = x @ np.asarray([3.0, -2.0, 1.0, 0.5]) + rng.normal(0, 0.5, size=600)
    model = convert(LinearRegression().fit(x, y), x[:64]).onnx_bytes
    worse = _shifted_regressor(model, 1.0)

    def shifted(data, ctx):
        yield Candidate("shifted", "prune", worse, note="every answer +1")

    monkeypatch.setitem(optimizer_module.TECHNIQUES, "shift", shifted)

    def run(rows: np.ndarray) -> object:
        return optimize(model, rows, y, task="regression", class_labels=None,
                        missing_values="allow",
                        options=OptimizeOptions(techniques=["shift"], fast=True, rounds=20,
                                                passes=2, bootstrap=100, min_speedup=0))

    markdown = to_markdown(run(x))
    header = next(line for line in markdown.splitlines() if line.startswith("| candidate"))
    row = next(line for line in markdown.splitlines() if line.startswith("| shifted"))
    for rows_of in ("choice rows (verdict)", "evaluation rows"):
        title = f" rmse change, {rows_of}, lower is better [95% CI] "
        change = row.split("|")[header.split("|").index(title)]
        assert change.strip().startswith("+")  # the RMSE went up: positive, lower is better

    rows = x.copy()
    rows[::10, 1] = np.nan  # this model answers NaN there, and so does the candidate
    report = run(rows)
    assert report.result("shifted").max_abs_diff == pytest.approx(1.0, abs=1e-4)
    row = next(line for line in to_markdown(report).splitlines()
               if line.startswith("| shifted"))
    assert "nan" not in row.lower()


def test_compare_outputs_treats_equal_nan_rows_as_equal():
    ref = Outputs(np.asarray([[1.0], [np.nan], [3.0]]))
    out = Outputs(np.asarray([[1.5], [np.nan], [3.0]]))
    assert compare_outputs("regression", ref, out)["max_abs_diff"] == 0.5
    lost = Outputs(np.asarray([[1.0], [2.0], [np.nan]]))
    assert compare_outputs("regression", ref, lost)["max_abs_diff"] == float("inf")
