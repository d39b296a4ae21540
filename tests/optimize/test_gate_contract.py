"""The gate catches a broken contract (renamed inputs or outputs, reversed class labels, a
different feature count) with its own exit code, lets an ordinary retrain and an optimized
regressor through by default, and promotes only what passed."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from markdown_it import MarkdownIt

from redline.optimize.distill import rename_io
from redline.optimize.gate import EXIT_DISAGREEMENT, EXIT_SIGNATURE
from tests.optimize.conftest import run_cli

RELAXED = ["--max-slowdown", "0", "--rounds", "40", "--passes", "2"]


@pytest.fixture()
def production(repo, digits, digits_mlp):
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    repo.promote("digits", 1)
    return repo


def _gate(repo, npz, capsys, *extra):
    return run_cli(["gate", "-m", "digits", "--data", npz, "-r", repo.root, *RELAXED, *extra],
                   capsys)


def _bytes(repo, version=1):
    return repo.model_path("digits", version).read_bytes()


def test_renamed_input_fails_with_exit_14_unless_intended(production, digits_npz, capsys):
    meta = production.metadata("digits", 1)
    renamed = rename_io(_bytes(production), {meta.inputs[0].name: "features"})
    production.add_onnx("digits", renamed, class_labels=meta.class_labels)  # v2
    code, _, err = _gate(production, digits_npz, capsys, "--candidate", "2")
    assert code == EXIT_SIGNATURE == 14
    assert "signature changed: input names ['input'] -> ['features']" in err
    assert "clients of the baseline would break" in err
    code, out, err = _gate(production, digits_npz, capsys, "--candidate", "2",
                           "--allow-signature-change")
    assert code == 0, err
    assert "declared intended" in out


def test_renamed_outputs_fail_with_exit_14(production, digits_npz, capsys):
    meta = production.metadata("digits", 1)
    names = {o.name: f"{o.name}_v2" for o in meta.outputs}
    production.add_onnx("digits", rename_io(_bytes(production), names),
                        class_labels=meta.class_labels)
    code, _, err = _gate(production, digits_npz, capsys, "--candidate", "2")
    assert code == EXIT_SIGNATURE
    assert "output names ['label', 'probabilities'] -> ['label_v2', 'probabilities_v2']" in err


def test_reversed_class_labels_fail_with_exit_14(production, digits_npz, tmp_path, capsys):
    production.add_onnx("digits", _bytes(production), class_labels=list(range(9, -1, -1)))
    md = tmp_path / "gate.md"
    code, _, err = _gate(production, digits_npz, capsys, "--candidate", "2", "--markdown", md)
    assert code == EXIT_SIGNATURE
    assert "(same labels, different order)" in err
    html = MarkdownIt("commonmark").enable("table").render(md.read_text())
    assert "<table>" in html and "signature" in html


def test_fewer_features_is_a_signature_change_and_a_clear_data_error(
        production, digits, tmp_path, capsys):
    from sklearn.neural_network import MLPClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        narrow = MLPClassifier((16,), max_iter=30, random_state=0).fit(
            digits.x_train[:, :63], digits.y_train)
    production.add_estimator("digits", narrow, digits.x_train[:64, :63])  # v2: 63 features
    data = tmp_path / "narrow.npz"
    np.savez(data, X=digits.x_val[:, :63], y=digits.y_val)
    code, _, err = _gate(production, data, capsys, "--candidate", "2")
    assert code == EXIT_SIGNATURE
    assert "input 'input' shape [-1, 64] -> [-1, 63]" in err and "Traceback" not in err
    code, _, err = _gate(production, data, capsys, "--candidate", "2",
                         "--allow-signature-change")
    assert code == 2 and "Traceback" not in err
    assert "baseline v1 expects 64 (it fits the candidate only)" in err


def test_an_ordinary_retrain_passes_the_default_disagreement(production, digits, digits_npz,
                                                             capsys):
    from sklearn.neural_network import MLPClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        retrain = MLPClassifier((64,), max_iter=60, random_state=1).fit(
            digits.x_train, digits.y_train)
    production.add_estimator("digits", retrain, digits.x_train[:64])
    code, out, err = _gate(production, digits_npz, capsys, "--candidate", "2", "--json")
    assert code == 0, err
    result = json.loads(out)
    check = next(c for c in result["checks"] if c["name"] == "disagreement")
    assert 0 < check["measured"] <= check["limit"]
    assert "the baseline's error rate" in check["message"]
    low, high = check["interval"]
    assert low <= check["measured"] <= high
    # the same candidate against an explicit 1% limit fails: the default is what changed
    code, _, err = _gate(production, digits_npz, capsys, "--candidate", "2",
                         "--max-disagreement", "0.01")
    assert code == EXIT_DISAGREEMENT


@pytest.fixture()
def regressors(repo, tmp_path):
    from sklearn.datasets import load_diabetes
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from redline.optimize.quantize import dynamic_int8

    x, y = load_diabetes(return_X_y=True)
    x = x.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        good = make_pipeline(StandardScaler(), MLPRegressor(
            hidden_layer_sizes=(32,), max_iter=400, random_state=0,
            learning_rate_init=0.01)).fit(x, y)
        noise = make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(32,), max_iter=400,
                                                             random_state=0)).fit(
            x, np.random.default_rng(0).permutation(y))
    base = repo.add_estimator("diabetes", good, x[:64])
    repo.promote("diabetes", base.version)
    quantized = dynamic_int8(repo.model_path("diabetes", 1).read_bytes())
    repo.add_onnx("diabetes", quantized)  # v2: what optimize would make
    repo.add_estimator("diabetes", noise, x[:64])  # v3: a broken retrain
    data = tmp_path / "reg.npz"
    np.savez(data, X=x[300:], y=y[300:])
    return repo, data


def test_an_optimized_regressor_passes_and_a_broken_one_fails(regressors, capsys):
    repo, data = regressors
    args = ["gate", "-m", "diabetes", "--data", data, "-r", repo.root, *RELAXED]
    code, out, err = run_cli([*args, "--candidate", "2", "--json"], capsys)
    assert code == 0, err
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "relative_error")
    assert check["passed"] and check["measured"] < 0.05
    code, _, err = run_cli([*args, "--candidate", "3"], capsys)
    assert code == EXIT_DISAGREEMENT
    assert "of the baseline's RMSE on these rows" in err


def test_promote_moves_the_alias_only_when_the_gate_passes(production, digits_npz, capsys):
    production.add_onnx("digits", _bytes(production), class_labels=list(range(10)))  # v2
    production.add_onnx("digits", _bytes(production), class_labels=list(range(9, -1, -1)))
    code, _, _ = _gate(production, digits_npz, capsys, "--candidate", "3",
                       "--promote", "production")
    assert code == EXIT_SIGNATURE and production.aliases("digits")["production"] == 1
    code, out, err = _gate(production, digits_npz, capsys, "--candidate", "2",
                           "--promote", "production")
    assert code == 0, err
    assert production.aliases("digits")["production"] == 2 and "promoted v2" in out


def test_a_regressor_whose_answers_all_moved_fails_by_default(repo, tmp_path, capsys):
    """An accurate regressor's answers spread widely, so a shift that triples its error is a
    small share of that spread; against the baseline's own error it is not."""
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 8)).astype(np.float32)
    y = x @ rng.uniform(100, 220, size=8) + rng.normal(0, 25, size=600)
    good = LinearRegression().fit(x[:400], y[:400])
    shifted = LinearRegression().fit(x[:400], y[:400] + 60)  # every answer +60
    repo.add_estimator("price", good, x[:64])
    repo.promote("price", 1)
    repo.add_estimator("price", shifted, x[:64])  # v2
    data = tmp_path / "gate.npz"
    np.savez(data, X=x[400:], y=y[400:])
    code, out, err = run_cli(["gate", "-m", "price", "--candidate", "2", "--data", data,
                              "-r", repo.root, *RELAXED, "--json"], capsys)
    assert code == EXIT_DISAGREEMENT, err
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "relative_error")
    assert check["measured"] > 2 and check["limit"] == 1.0  # 60 against an RMSE near 25
    assert "of the baseline's RMSE on these rows" in check["message"]
    spread = float(np.std(good.predict(x[400:])))
    assert 60 / spread < 0.15  # what the spread-relative bound let through
