"""`redline models ...` and `redline predict` through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import joblib
import numpy as np
import pytest

from tests.models.cli import run


@pytest.fixture()
def model_file(tmp_path, classifier_onnx):
    path = tmp_path / "bc.onnx"
    path.write_bytes(classifier_onnx)
    return path


def test_add_list_show_promote_rollback_remove(capsys, tmp_path, model_file, breast_cancer):
    r = str(tmp_path / "repo")
    np.savez(tmp_path / "sample.npz", X=breast_cancer[0][:50])
    code, out, _ = run(
        capsys,
        "models",
        "add",
        "-m",
        "bc",
        str(model_file),
        "-r",
        r,
        "--labels",
        "0,1",
        "--sample",
        str(tmp_path / "sample.npz"),
    )
    assert code == 0 and "added bc version 1" in out
    assert run(capsys, "models", "add", "-m", "bc", str(model_file), "-r", r)[0] == 0
    code, out, _ = run(capsys, "models", "list", "-r", r, "--json")
    listed = json.loads(out)
    assert listed == [
        {"name": "bc", "versions": [1, 2], "aliases": {}, "policy": "latest:1", "live": [2]}
    ]
    code, out, _ = run(capsys, "models", "show", "-m", "bc", "--version", "1", "-r", r,
                       "--verify")
    shown = json.loads(out.split("sha256 verified")[0])
    assert shown["class_labels"] == [0, 1] and shown["task"] == "classification"
    assert "30 features profiled" in shown["input_profile"]
    bc = ("-m", "bc", "-r", r)
    assert "production -> version 1" in run(capsys, "models", "promote", *bc, "--version", "1")[1]
    assert "production -> version 2" in run(capsys, "models", "promote", *bc, "--version", "2")[1]
    assert "rolled back to version 1" in run(capsys, "models", "rollback", *bc)[1]
    assert "live versions [1, 2]" in run(capsys, "models", "policy", *bc, "latest:2")[1]
    assert "removed bc version 2" in run(capsys, "models", "remove", *bc, "--version", "2")[1]
    code, _, err = run(capsys, "models", "remove", "-m", "bc", "--version", "1", "-r", r)
    assert code == 2 and "error [repository_conflict]" in err and "target of alias" in err


def test_predict_accepts_rows_named_inputs_and_feature_objects(
    capsys, tmp_path, model_file, breast_cancer
):
    r = str(tmp_path / "repo")
    names = ",".join(f"f{i}" for i in range(30))
    run(
        capsys,
        "models",
        "add",
        "-m",
        "bc",
        str(model_file),
        "-r",
        r,
        "--labels",
        "0,1",
        "--feature-names",
        names,
    )
    row = breast_cancer[0][0].tolist()
    code, out, _ = run(capsys, "predict", "-m", "bc", "-r", r, "-i", json.dumps([row]))
    assert code == 0
    result = json.loads(out)
    assert result["model_version"] == 1 and result["class_labels"] == [0, 1]
    assert len(result["outputs"]["probabilities"][0]) == 2
    by_name = json.dumps({f"f{i}": v for i, v in enumerate(row)})
    assert json.loads(run(capsys, "predict", "-m", "bc", "-r", r, "-i", by_name)[1]) == result
    (tmp_path / "in.json").write_text(json.dumps({"X": [row]}))
    assert (
        json.loads(run(capsys, "predict", "-m", "bc", "-r", r, "-i", f"@{tmp_path / 'in.json'}")[1])
        == result
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["predict", "-m", "nope", "-i", "[[1]]"],
            "error [model_not_found]: model 'nope' not found",
        ),
        (
            ["predict", "-m", "bc", "-i", "[[1, 2"],
            "error [invalid_input]: --input is not valid JSON",
        ),
        (["predict", "-m", "bc", "-i", "[[1, 2]]"], "has 2 along axis 1 but the model expects 30"),
        (["predict", "-m", "bc", "-i", "[[NaN" + ", 1" * 29 + "]]"], "contains NaN or infinity"),
        (["predict", "-m", "bc", "-i", '{"zzz": 1}'], "neither input names"),
        (["predict", "-m", "bc", "--version", "7", "-i", "[[1]]"], "has no version 7"),
    ],
)
def test_predict_errors_are_one_clear_line(capsys, tmp_path, model_file, args, message):
    r = str(tmp_path / "repo")
    run(capsys, "models", "add", "-m", "bc", str(model_file), "-r", r)
    code, _, err = run(capsys, *args, "-r", r)
    assert code == 2 and message in err and "Traceback" not in err


def test_pickle_needs_explicit_trust_and_converts(capsys, tmp_path, breast_cancer):
    from sklearn.linear_model import LogisticRegression

    x, y = breast_cancer
    est = LogisticRegression(max_iter=2000).fit(x, y)
    joblib.dump(est, tmp_path / "clf.joblib")
    np.savez(tmp_path / "sample.npz", X=x[:100])
    r = str(tmp_path / "repo")
    code, _, err = run(capsys, "models", "add", "-m", "bc", str(tmp_path / "clf.joblib"), "-r", r)
    assert code == 2 and "--trust-pickle" in err and "runs whatever code" in err
    code, out, err = run(
        capsys,
        "models",
        "add",
        "-m",
        "bc",
        str(tmp_path / "clf.joblib"),
        "-r",
        r,
        "--trust-pickle",
        "--sample",
        str(tmp_path / "sample.npz"),
    )
    assert code == 0, err
    assert "scikit-learn" in out


def test_corrupt_model_file_is_named(capsys, tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x00garbage")
    code, _, err = run(capsys, "models", "add", "-m", "bc", str(bad), "-r", str(tmp_path / "r"))
    assert code == 2 and "broken.onnx is not a valid ONNX model" in err


def test_console_script_help_is_instant_and_teaches():
    proc = subprocess.run(
        [sys.executable, "-m", "redline.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    for command in ("models", "predict", "serve", "bench", "features", "optimize", "gate"):
        assert command in proc.stdout


def test_add_refuses_a_nan_default_into_a_model_that_rejects_nan(capsys, tmp_path, model_file):
    """Checked at registration as at load, with the fix named; nothing is written."""
    defs = tmp_path / "defs.py"
    text = ("from redline.features import Entity, EventSource, FeatureView, count, mean\n"
            "card = Entity('card', 'card_id')\n"
            "tx = EventSource('tx', card, {'amount': float})\n"
            "v = FeatureView('v', tx, [count('1h'), mean('amount', '1h'DEFAULT)])\n")
    defs.write_text(text.replace("DEFAULT", ""))
    cfg = tmp_path / "redline.yaml"
    cfg.write_text(f"features:\n  definitions: {defs}\n")
    r = str(tmp_path / "repo")
    names = ",".join([*(f"x{i}" for i in range(28)), "v:count_1h", "v:amount_mean_1h"])
    add = ("models", "add", "-m", "bc", str(model_file), "-r", r, "--config", str(cfg),
           "--feature-names", names)
    code, out, err = run(capsys, *add)
    assert code != 0 and "added" not in out
    assert "'v:amount_mean_1h' (mean, default NaN)" in err
    assert "finite default" in err and "--missing-values allow" in err
    assert "Traceback" not in err
    assert run(capsys, "models", "list", "-r", r, "--json")[1].strip() in ("[]", "")
    code, out, _ = run(capsys, *add, "--missing-values", "allow")
    assert code == 0 and "added bc version 1" in out
    defs.write_text(text.replace("DEFAULT", ", default=0.0"))
    code, out, _ = run(capsys, *add)
    assert code == 0 and "added bc version 2" in out
    # plain inputs never meet a feature's default
    plain = ("models", "add", "-m", "bc", str(model_file), "-r", r, "--config", str(cfg))
    assert run(capsys, *plain)[0] == 0


def test_a_retrained_version_keeps_the_feature_names_or_says_it_dropped_them(capsys, tmp_path,
                                                                               breast_cancer):
    """The second `models add` of docs/your-own-model.md passes no --feature-names: the new
    version reads the same 30 columns, so it keeps version 1's names (its drift profile too);
    a model of another width cannot, and the command says so."""
    from sklearn.linear_model import LogisticRegression

    from redline.models import ModelRepository

    x, y = breast_cancer
    r = str(tmp_path / "repo")
    names = [f"col_{i}" for i in range(30)]
    np.savez(tmp_path / "sample.npz", X=x[:100])
    np.savez(tmp_path / "narrow.npz", X=x[:100, :10])

    def add(model, sample: str, *extra: str) -> tuple[int, str, str]:
        joblib.dump(model, tmp_path / "model.joblib")
        return run(capsys, "models", "add", "-m", "cancer", str(tmp_path / "model.joblib"),
                   "--trust-pickle", "--sample", str(tmp_path / sample), "-r", r, *extra)

    code, _, err = add(LogisticRegression(max_iter=2000).fit(x, y), "sample.npz",
                       "--feature-names", ",".join(names))
    assert code == 0, err
    code, out, err = add(LogisticRegression(max_iter=3000, C=0.5).fit(x, y), "sample.npz",
                         "--description", "retrained")
    assert code == 0, err
    assert "feature names: the 30 of version 1" in out
    v2 = ModelRepository(r).metadata("cancer", 2)
    assert v2.feature_names == names and sorted(v2.input_profile["features"]) == sorted(names)
    code, out, err = add(LogisticRegression(max_iter=2000).fit(x[:, :10], y), "narrow.npz")
    assert code == 0, err
    assert ("warning: version 2 of 'cancer' names its 30 features, but this model's input "
            "'input' has 10 columns" in err), err
    assert "--feature-names" in err and "Traceback" not in err
    assert ModelRepository(r).metadata("cancer", 3).feature_names is None
