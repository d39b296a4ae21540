"""``redline gate`` through the real CLI: a good candidate passes, each kind of bad candidate
fails with its own exit code and a readable reason, reports are written, bad input is refused."""

from __future__ import annotations

import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from redline.optimize.gate import EXIT_ACCURACY, EXIT_DISAGREEMENT, EXIT_P99, EXIT_SLOWDOWN
from tests.optimize.conftest import run_cli

# Generous latency limits for checks that are not under test: the machine is shared. Two
# passes: the slowdown check fails only when its whole interval is over the limit, and two
# passes' interval is wider than ten's.
RELAXED = ["--max-slowdown", "3", "--rounds", "200", "--passes", "2"]


@pytest.fixture()
def gated(repo, digits, digits_mlp):
    """v1 = production MLP; v2 = the same model again (a good candidate)."""
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    repo.promote("digits", 1)
    repo.add_onnx("digits", repo.model_path("digits", 1), class_labels=list(range(10)))
    return repo


def _gate(repo, npz, capsys, *extra):
    return run_cli(["gate", "--model", "digits", "--data", npz, "-r", repo.root, *extra], capsys)


def _fit_mlp(x, y, seed, iters=60):
    from sklearn.neural_network import MLPClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MLPClassifier((64,), max_iter=iters, random_state=seed).fit(x, y)


def test_good_candidate_passes_with_reports(gated, digits_npz, tmp_path, capsys):
    md, junit = tmp_path / "gate.md", tmp_path / "gate.xml"
    code, out, err = _gate(gated, digits_npz, capsys, "--candidate", "2", "--p99-ms", "50",
                           "--max-accuracy-drop", "0.01", "--max-slowdown", "1.5",
                           "--markdown", md, "--junit", junit)
    assert code == 0, err
    assert "gate PASSED: digits v2 against production (v1)" in out
    assert "[FAIL]" not in out and "[ok] candidate accuracy" in out
    assert "✅ redline gate passed" in md.read_text()
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and suite.get("tests") == "5"
    assert {c.get("name") for c in suite.iter("testcase")} == {
        "signature", "p99_budget", "slowdown", "accuracy", "disagreement"}


def test_junit_counts_skipped_cases_in_tests(gated, digits_npz, tmp_path, capsys):
    junit = tmp_path / "gate.xml"
    code, _, err = _gate(gated, digits_npz, capsys, "--candidate", "2", *RELAXED,
                         "--junit", junit)  # no --p99-ms, no --max-accuracy-drop: 2 skipped
    assert code == 0, err
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    cases = list(suite.iter("testcase"))
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert len(cases) == 5 and len(skipped) == 2
    assert suite.get("tests") == "5" and suite.get("skipped") == "2"
    assert root.get("tests") == "5"


def test_p99_over_budget_fails_with_exit_10(gated, digits_npz, tmp_path, capsys):
    junit = tmp_path / "gate.xml"
    code, _, err = _gate(gated, digits_npz, capsys, "--candidate", "2", "--p99-ms", "0.0001",
                         *RELAXED, "--junit", junit)
    assert code == EXIT_P99 == 10
    assert "[FAIL] candidate p99" in err and "over the 0.0001 ms budget" in err
    failures = [c for c in ET.parse(junit).getroot().iter("testcase")
                if c.find("failure") is not None]
    assert [c.get("name") for c in failures] == ["p99_budget"]


@pytest.mark.slow
def test_slower_candidate_fails_with_exit_11(gated, digits, digits_npz, capsys):
    from sklearn.ensemble import RandomForestClassifier

    slow = RandomForestClassifier(200, random_state=0).fit(digits.x_train, digits.y_train)
    gated.add_estimator("digits", slow, digits.x_train[:64])  # v3: ~10x slower per row
    code, _, err = _gate(gated, digits_npz, capsys, "--candidate", "3", "--max-slowdown", "1.2",
                         "--max-disagreement", "1", "--rounds", "100")
    assert code == EXIT_SLOWDOWN == 11
    assert "[FAIL] candidate median latency is" in err and "allowed 1.2x" in err


def test_less_accurate_candidate_fails_with_exit_12(gated, digits, digits_npz, capsys):
    shuffled = np.random.default_rng(1).permutation(digits.y_train)
    bad = _fit_mlp(digits.x_train, shuffled, seed=0, iters=20)  # learned noise
    gated.add_estimator("digits", bad, digits.x_train[:64])  # v3
    code, out, err = _gate(gated, digits_npz, capsys, "--candidate", "3",
                           "--max-accuracy-drop", "0.01", *RELAXED)
    assert code == EXIT_ACCURACY == 12
    assert "[FAIL] candidate accuracy" in err and "allowed drop 0.01" in err
    # it also disagrees; every reason is printed, the code is the first failing kind
    assert "[FAIL] candidate answers differently" in err


def test_disagreeing_candidate_fails_with_exit_13(gated, digits, digits_npz, capsys):
    other = _fit_mlp(digits.x_train, digits.y_train, seed=7)  # as accurate, different answers
    gated.add_estimator("digits", other, digits.x_train[:64])  # v3
    code, _, err = _gate(gated, digits_npz, capsys, "--candidate", "3",
                         "--max-accuracy-drop", "0.05", "--max-disagreement", "0.001", *RELAXED)
    assert code == EXIT_DISAGREEMENT == 13
    assert "[ok] candidate accuracy" in err
    assert "[FAIL] candidate answers differently from the baseline on" in err


@pytest.mark.slow
def test_gate_exit_code_from_a_real_process(gated, digits_npz, tmp_path):
    md = tmp_path / "pr-comment.md"
    result = subprocess.run(
        [sys.executable, "-m", "redline.cli", "gate", "--model", "digits", "--candidate", "2",
         "--p99-ms", "0.0001", "--data", str(digits_npz), "-r", str(gated.root),
         "--markdown", str(md), *RELAXED],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_P99, result.stderr
    assert "over the 0.0001 ms budget" in result.stderr
    assert "❌ redline gate failed" in md.read_text() and "**FAIL**" in md.read_text()


def test_gate_bad_inputs_give_clear_errors(gated, digits, digits_npz, tmp_path, capsys):
    code, _, err = run_cli(["gate", "--model", "nosuch", "--candidate", "1", "--data",
                            digits_npz, "-r", gated.root], capsys)
    assert code == 2 and "model 'nosuch' not found" in err

    code, _, err = _gate(gated, digits_npz, capsys, "--candidate", "9")
    assert code == 2 and "has no version 9" in err

    code, _, err = _gate(gated, digits_npz, capsys, "--candidate", "2", "--baseline", "canary")
    assert code == 2 and "no version or alias 'canary'" in err

    code, _, err = _gate(gated, tmp_path / "nope.npz", capsys, "--candidate", "2")
    assert code == 2 and "does not exist" in err

    csv = tmp_path / "val.csv"
    np.savetxt(csv, digits.x_val[:50], delimiter=",", comments="",
               header=",".join(f"f{i}" for i in range(64)))
    code, _, err = _gate(gated, csv, capsys, "--candidate", "2", "--label", "digit",
                         "--max-accuracy-drop", "0.01")
    assert code == 2 and "no label column 'digit'" in err
    # without an accuracy check, labels are optional
    code, out, err = _gate(gated, csv, capsys, "--candidate", "2", "--label", "digit",
                           "--max-slowdown", "0", "--rounds", "50")
    assert code == 0, err

    narrow = tmp_path / "narrow.npz"
    np.savez(narrow, X=digits.x_val[:, :63], y=digits.y_val)
    code, _, err = _gate(gated, narrow, capsys, "--candidate", "2")
    assert code == 2 and "63 features per row" in err and "expects 64" in err

    code, _, err = run_cli(["gate", "--model", "digits", "--data", digits_npz], capsys)
    assert code == 2 and "--candidate" in err
