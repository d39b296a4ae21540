"""``redline optimize`` through the real CLI entry point: it measures, chooses, registers with
the recipe and profile in metadata, writes reports, and refuses bad input clearly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.optimize.conftest import run_cli

# Two interleaved passes: no test here judges a latency figure beyond its shape.
FAST = ["--fast", "--rounds", "40", "--passes", "2", "--max-seconds", "5"]
# Timing on a shared machine is noisy: tests accept any speed-up (the rule "fastest within
# tolerance" is asserted on the measured numbers instead); the benchmarks measure real gains.
ANY_SPEED = ["--min-speedup", "0"]


@pytest.fixture()
def train_npz(tmp_path, digits):
    path = tmp_path / "train.npz"
    np.savez(path, X=digits.x_train, y=digits.y_train)
    return path


@pytest.fixture()
def digits_repo(repo, digits, digits_mlp):
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    return repo


def test_optimize_registers_the_chosen_candidate(digits_repo, digits_npz, train_npz, tmp_path,
                                                 capsys):
    report_json, report_md = tmp_path / "r.json", tmp_path / "r.md"
    code, out, err = run_cli(
        ["optimize", "digits", "--data", digits_npz, "-r", digits_repo.root,
         "--train-data", train_npz, "--techniques", "quantize,prune,distill", *ANY_SPEED,
         "--tolerance", "0.03", "--guard-tolerance", "0.3", "--json-out", report_json,
         "--markdown", report_md, *FAST],
        capsys)
    assert code == 0, err
    report = json.loads(report_json.read_text())
    assert report["chosen"], report["reason"]
    names = {c["name"] for c in report["candidates"]}
    assert {"original", "int8-dynamic", "int8-static-minmax", "prune-50",
            "distill-mlp-32"} <= names
    for cand in report["candidates"]:  # batch 1 and the typical batch, measured in one run
        assert set(cand["latency"]) == {"1", "32"}
        assert cand["latency"]["1"]["p99_us"] >= cand["latency"]["1"]["p50_us"] > 0
        assert "accuracy" in cand["metrics"] and cand["max_abs_diff"] >= 0
    chosen = next(c for c in report["candidates"] if c["name"] == report["chosen"])
    assert chosen["within_tolerance"] and chosen["choice"]["interval"][1] <= 0.03
    assert chosen["evaluation"]["interval"][1] <= 0.03  # confirmed on the evaluation rows
    # the chosen candidate is the fastest of those within tolerance at batch 32, or one the
    # measurement cannot tell apart from it
    eligible = [c for c in report["candidates"] if c["within_tolerance"] and
                c["name"] != "original"]
    fastest = max(eligible, key=lambda c: c["speedup"]["32"])
    assert report["chosen"] in (fastest["name"], fastest["tied_with"])
    low, high = chosen["speedup_interval"]["32"]
    assert low <= chosen["speedup"]["32"] <= high
    # registered as version 2, with how it was made and what it measured
    assert digits_repo.versions("digits") == [1, 2]
    meta = digits_repo.metadata("digits", 2)
    opt = meta.extra["optimization"]
    assert opt["candidate"] == report["chosen"] and opt["source"]["version"] == 1
    assert opt["profile"]["latency"]["32"]["p50_us"] == chosen["latency"]["32"]["p50_us"]
    assert meta.class_labels == list(range(10)) and meta.metrics["accuracy"] > 0.9
    assert report["registered"] == {"model": "digits", "version": 2, "fallback": False,
                                    "serving": False}
    assert meta.requires_promotion and digits_repo.resolve("digits", None) == 1
    markdown = report_md.read_text()
    assert "| candidate |" in markdown and f"**{report['chosen']}**" in markdown
    assert report["chosen"] in out and "registered as" in out


def test_a_ci_log_shows_progress_lines_and_a_table_that_fits(digits_repo, digits_npz,
                                                            train_npz, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # stdout and stderr are not terminals here, as in CI
    code, out, err = run_cli(
        ["optimize", "digits", "--data", digits_npz, "-r", digits_repo.root, "--train-data",
         train_npz, "--techniques", "quantize", "--calibration-methods", "minmax",
         "--no-register", "--bootstrap", "100", *FAST], capsys)
    assert code == 0, err
    lines = err.splitlines()
    assert any("building candidates 1/1: quantize: int8-dynamic" in line for line in lines)
    assert any("evaluating (one model at a time)" in line and line.endswith(": original")
               for line in lines)
    timed = [line for line in lines if "measuring latency" in line and "pass " in line]
    assert len(timed) == 2 * 3  # every model in each of FAST's two passes: original, two int8
    assert any(line.endswith("pass 2/2: int8-dynamic") for line in timed)
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "int8-dynamic" in out and "Every column is in the Markdown" in " ".join(out.split())


def test_optimize_as_fallback_and_csv_data(digits_repo, digits, train_npz, tmp_path, capsys):
    csv = tmp_path / "val.csv"
    header = ",".join([f"f{i}" for i in range(64)] + ["digit"])
    rows = np.column_stack([digits.x_val, digits.y_val])
    np.savetxt(csv, rows, delimiter=",", header=header, comments="", fmt="%.6g")
    code, out, err = run_cli(
        ["optimize", "digits", "--data", csv, "--label", "digit", "-r", digits_repo.root,
         "--train-data", train_npz, "--techniques", "prune", "--tolerance", "0.05",
         "--guard-metric", "none",
         "--as-fallback", *ANY_SPEED, *FAST], capsys)
    assert code == 0, err
    fallback = digits_repo.metadata("digits-fast")
    assert fallback.extra["optimization"]["fallback_for"] == "digits"
    assert fallback.extra["optimization"]["technique"] == "prune"
    # the original's bytes come back as version 2, now pointing at its fallback
    assert digits_repo.versions("digits") == [1, 2]
    linked = digits_repo.metadata("digits", 2)
    assert linked.fallback == "digits-fast"
    assert linked.sha256 == digits_repo.metadata("digits", 1).sha256
    assert digits_repo.metadata("digits", 1).fallback is None
    assert "promote it to serve with the fallback" in out


def test_no_register_leaves_the_repository_alone(digits_repo, digits_npz, capsys):
    code, _, err = run_cli(["optimize", "digits", "--data", digits_npz, "-r", digits_repo.root,
                            "--techniques", "graph", "--no-register", *FAST], capsys)
    assert code == 0, err
    assert digits_repo.versions("digits") == [1]


def test_optimize_bad_inputs_give_clear_errors(digits_repo, digits, digits_npz, tmp_path,
                                               capsys):
    root = digits_repo.root
    code, _, err = run_cli(["optimize", "nosuch", "--data", digits_npz, "-r", root], capsys)
    assert code == 2 and "model 'nosuch' not found" in err

    code, _, err = run_cli(["optimize", "digits", "--data", tmp_path / "missing.npz",
                            "-r", root], capsys)
    assert code == 2 and "does not exist" in err

    csv = tmp_path / "nolabel.csv"
    np.savetxt(csv, digits.x_val[:20], delimiter=",", comments="",
               header=",".join(f"f{i}" for i in range(64)))
    code, _, err = run_cli(["optimize", "digits", "--data", csv, "-r", root], capsys)
    assert code == 2 and "no label column 'label'" in err

    narrow = tmp_path / "narrow.npz"
    np.savez(narrow, X=digits.x_val[:, :10], y=digits.y_val)
    code, _, err = run_cli(["optimize", "digits", "--data", narrow, "-r", root, *FAST], capsys)
    assert code == 2 and "10 features per row" in err and "expects 64" in err

    unlabeled = tmp_path / "x_only.npz"
    np.savez(unlabeled, X=digits.x_val)
    code, _, err = run_cli(["optimize", "digits", "--data", unlabeled, "-r", root], capsys)
    assert code == 2 and "no labels" in err

    code, _, err = run_cli(["optimize", "digits", "--data", digits_npz, "-r", root,
                            "--techniques", "magic"], capsys)
    assert code == 2 and "unknown technique" in err
    assert digits_repo.versions("digits") == [1]


def test_help_teaches_with_examples(capsys):
    code, out, _ = run_cli(["optimize", "--help"], capsys)
    assert code == 0 and "Examples:" in out and "redline optimize fraud --data val.npz" in out
    code, out, _ = run_cli(["gate", "--help"], capsys)
    assert code == 0 and "Exit codes:" in out and "13" in out
