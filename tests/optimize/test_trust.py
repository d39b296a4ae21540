"""What makes optimize's answer trustworthy: NaN/inf never reach training or the repository,
figures carry intervals and are confirmed on rows nothing chose on, and the reports render."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import pytest
from markdown_it import MarkdownIt
from onnx import numpy_helper

from redline.errors import InvalidInput
from redline.optimize import OptimizeOptions, optimize
from redline.optimize import optimizer as optimizer_module
from redline.optimize.candidates import Candidate
from redline.optimize.optimizer import split
from redline.optimize.quantize import static_int8
from redline.optimize.safety import describe_nonfinite
from tests.optimize.conftest import run_cli

DIGITS = list(range(10))
QUICK = dict(fast=True, rounds=20, passes=2, bootstrap=100)


def _with_bad_cells(x: np.ndarray) -> np.ndarray:
    bad = x.copy()
    bad[3, 5], bad[10, 5], bad[7, 9] = np.nan, np.inf, -np.inf
    return bad


# ------------------------------------------------------------------ non-finite inputs
def test_nonfinite_data_is_refused_for_a_model_that_rejects_them(repo, digits, digits_mlp,
                                                                 tmp_path, capsys):
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    assert repo.metadata("digits").missing_values == "reject"
    data, train = tmp_path / "val.npz", tmp_path / "train.npz"
    np.savez(data, X=_with_bad_cells(digits.x_val), y=digits.y_val)
    np.savez(train, X=digits.x_train, y=digits.y_train)
    code, _, err = run_cli(["optimize", "-m", "digits", "--data", data, "-r", repo.root,
                            "--fast"], capsys)
    assert code == 2 and "Traceback" not in err
    assert "column 5: 1 NaN, 1 +inf; column 9: 1 -inf" in err
    assert "in 3 of" in err and "missing_values: reject" in err
    good = tmp_path / "good.npz"
    np.savez(good, X=digits.x_val, y=digits.y_val)
    np.savez(train, X=_with_bad_cells(digits.x_train), y=digits.y_train)
    code, _, err = run_cli(["optimize", "-m", "digits", "--data", good, "--train-data", train,
                            "-r", repo.root, "--fast"], capsys)
    assert code == 2 and "--train-data" in err and "1 +inf" in err
    assert repo.versions("digits") == [1]


def test_describe_nonfinite_names_nan_and_inf_apart():
    x = np.array([[np.nan, 1.0], [np.inf, -np.inf], [np.nan, 2.0]])
    assert describe_nonfinite(x, ["age", "amount"]) == \
        "'age': 2 NaN, 1 +inf; 'amount': 1 -inf"


def test_nan_rows_are_evaluated_but_never_learned_from(cancer):
    lightgbm = pytest.importorskip("lightgbm")
    from redline.models.convert import convert

    booster = lightgbm.LGBMClassifier(n_estimators=40, num_leaves=8, verbose=-1).fit(
        cancer.x_train, cancer.y_train)
    converted = convert(booster, cancer.x_train[:64])
    assert converted.handles_missing
    x = np.concatenate([cancer.x_train, cancer.x_val])
    y = np.concatenate([cancer.y_train, cancer.y_val])
    x = x.copy()
    x[::7, 2] = np.nan  # every 7th row: this model answers them itself
    report = optimize(converted.onnx_bytes, x, y, task="classification", class_labels=[0, 1],
                      missing_values="allow",
                      options=OptimizeOptions(techniques=["trees", "distill"], **QUICK))
    fit_total = len(split(x, y, [1 / 3, 1 / 3], 0)[0][0])
    assert 0 < report.rows["fit"] < fit_total  # NaN rows left out of what techniques learn
    # an MLP student cannot answer the NaN rows the original answers: never a candidate
    reasons = {s.name: s.reason for s in report.skipped}
    assert "break the original's contract" in reasons["distill"]
    for r in report.results:
        assert r.candidate is not None
        assert "distill" not in r.name


def _poisoned(model: bytes) -> tuple[bytes, bytes]:
    """(all-NaN output layer, finite weights whose outputs overflow to NaN)."""
    proto = onnx.load_from_string(model)
    biggest = max(proto.graph.initializer, key=lambda i: int(np.prod(i.dims)))
    nan, huge = onnx.ModelProto(), onnx.ModelProto()
    nan.CopyFrom(proto)
    huge.CopyFrom(proto)
    for target, value in ((nan, np.nan), (huge, 3e38)):
        init = next(i for i in target.graph.initializer if i.name == biggest.name)
        array = numpy_helper.to_array(init).copy()
        array[:] = value
        init.CopyFrom(numpy_helper.from_array(array, init.name))
    return nan.SerializeToString(), huge.SerializeToString()


def test_candidates_with_nonfinite_weights_or_outputs_are_rejected(digits, digits_mlp, onnx_of,
                                                                   monkeypatch):
    model = onnx_of(digits_mlp, digits.x_train)
    nan_bytes, huge_bytes = _poisoned(model)

    def broken(data, ctx):
        yield Candidate("prune-nan", "prune", nan_bytes, note="a fine-tune gone wrong")
        yield Candidate("prune-overflow", "prune", huge_bytes, note="outputs overflow")

    monkeypatch.setitem(optimizer_module.TECHNIQUES, "broken", broken)
    report = optimize(model, digits.x_val, digits.y_val, task="classification",
                      class_labels=DIGITS, tune=(digits.x_train, digits.y_train),
                      options=OptimizeOptions(techniques=["broken"], min_speedup=0, **QUICK))
    reasons = {s.name: s.reason for s in report.rejected}
    assert "weights are NaN or infinite" in reasons["prune-nan"]
    assert "answers NaN or infinity" in reasons["prune-overflow"]
    assert [r.name for r in report.results] == ["original"] and report.chosen is None


def test_register_refuses_nan_weights_even_when_asked(repo, digits, digits_mlp, onnx_of):
    from redline.optimize import register_candidate
    from redline.optimize.optimizer import CandidateResult, Judgement
    from redline.optimize.uncertainty import Interval

    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    nan_bytes, _ = _poisoned(onnx_of(digits_mlp, digits.x_train))
    zero = Judgement(0.0, Interval(0.0, 0.0))
    result = CandidateResult("prune-nan", "prune", "", {}, {}, 0, None, {}, {}, {}, zero, zero,
                             0.0, 0.0, True, candidate=Candidate("prune-nan", "prune", nan_bytes))
    with pytest.raises(InvalidInput, match="refusing to register 'prune-nan'"):
        register_candidate(repo, repo.metadata("digits"), None, result)  # type: ignore[arg-type]
    assert repo.versions("digits") == [1]


# ------------------------------------------------------------------ honest figures
def test_rows_are_split_into_three_disjoint_sets():
    x = np.arange(60, dtype=np.float32).reshape(30, 2)
    y = np.arange(30)
    parts = split(x, y, [1 / 3, 1 / 3], seed=0)
    seen = [set(part[1].tolist()) for part in parts]
    assert [len(s) for s in seen] == [10, 10, 10]
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


def test_a_pick_resting_on_noise_is_not_made(monkeypatch):
    """The regressor case of the issue: a candidate a hair better on average but whose own
    interval spans the tolerance is "too few rows to tell", not chosen."""
    from sklearn.datasets import make_regression
    from sklearn.linear_model import LinearRegression

    from redline.models.convert import convert

    x, y = make_regression(240, 5, noise=20.0, random_state=0)
    x = x.astype(np.float32)
    data = convert(LinearRegression().fit(x, y), x[:32]).onnx_bytes

    def shifted(model, ctx):  # shift the intercept: paired squared errors spread wide
        proto = onnx.load_from_string(model)
        node = next(n for n in proto.graph.node if n.op_type == "LinearRegressor")
        attr = next(a for a in node.attribute if a.name == "intercepts")
        attr.floats[0] += 4.0
        yield Candidate("shifted", "prune", proto.SerializeToString(), note="noise")

    monkeypatch.setitem(optimizer_module.TECHNIQUES, "shifted", shifted)
    report = optimize(data, x, y, task="regression", class_labels=None,
                      options=OptimizeOptions(techniques=["shifted"], tolerance=0.05,
                                              min_speedup=0, **QUICK))
    r = report.result("shifted")
    assert r.choice.loss < 0.05 < r.choice.interval.high  # looks fine, cannot be told
    assert r.verdict == "uncertain" and not r.within_tolerance
    assert report.chosen is None and "too few to tell" in report.reason
    low, high = r.intervals["rmse"].low, r.intervals["rmse"].high
    assert low < r.metrics["rmse"] < high


@pytest.mark.slow
def test_static_calibration_is_judged_on_other_rows_and_entropy_differs(digits, digits_mlp,
                                                                         onnx_of):
    from redline.optimize.quantize import CALIBRATION_ROWS

    model = onnx_of(digits_mlp, digits.x_train)
    minmax = static_int8(model, digits.x_train, method="minmax", calibration_rows=256)
    entropy = static_int8(model, digits.x_train, method="entropy", calibration_rows=256)
    assert minmax != entropy  # 2048 histogram bins for 128 levels: clipping can win
    fewer = static_int8(model, digits.x_train, method="minmax", calibration_rows=32)
    assert fewer != minmax and CALIBRATION_ROWS == 512  # the size is a real setting


# ------------------------------------------------------------------ reports
@pytest.fixture(scope="module")
def small_report(digits, digits_mlp, onnx_of):
    """One optimize run shared by the report tests: they only read and render it."""
    model = onnx_of(digits_mlp, digits.x_train)
    return optimize(model, digits.x_val, digits.y_val, task="classification",
                    class_labels=DIGITS, tune=(digits.x_train, digits.y_train),
                    options=OptimizeOptions(techniques=["graph", "quantize"], min_speedup=0,
                                            tolerance=0.05, **QUICK))


def test_markdown_report_renders_as_a_table(small_report):
    from redline.optimize.report import _headers, to_markdown

    text = to_markdown(small_report)
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    heads = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "th_open"]
    assert heads == _headers(small_report)  # every column survived: no stray '|'
    rows = sum(t.type == "tr_open" for t in tokens)
    assert rows == 1 + len(small_report.results)
    assert "95% bootstrap interval" in text and "one ONNX Runtime session alive" in text


def test_candidate_names_are_whole_in_a_ci_log(small_report, capsys):
    from redline.optimize.report import print_report

    print_report(small_report)  # stdout is not a terminal here, as in CI
    out = capsys.readouterr().out
    for r in small_report.results:
        assert r.name in out
    from rich.console import Console

    narrow = Console(file=io.StringIO(), width=60)
    print_report(small_report, console=narrow)
    text = narrow.file.getvalue()  # type: ignore[attr-defined]
    for r in small_report.results:
        assert r.name in text


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_table_fits_the_screen_and_shows_the_figures_behind_each_status(small_report,
                                                                              width):
    from rich.console import Console

    from redline.optimize.report import _change, print_report

    console = Console(file=io.StringIO(), width=width)
    print_report(small_report, console=console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert max(len(line) for line in text.splitlines()) <= width
    table = text[:text.index("Rows:")]
    for r in small_report.results:
        assert r.name in table
        # the status is decided on the choice rows: their figures stand beside it
        assert _change(r.choice.loss, r.choice.interval, 1, compact=True) in table
    assert "choice" in table and "verdict" in table
    assert "choice rows decide each candidate's status" in " ".join(text.split())
    if width < 200:
        assert "Every column is in the Markdown (--markdown) and JSON" in " ".join(text.split())


def test_the_markdown_report_labels_which_rows_each_figure_comes_from(small_report):
    from redline.optimize.report import _headers

    heads = _headers(small_report)
    assert "accuracy change, choice rows (verdict), higher is better [95% CI]" in heads
    assert "accuracy change, evaluation rows, higher is better [95% CI]" in heads
    assert "accuracy, evaluation rows [95% CI]" in heads


def test_a_log_gets_a_line_per_step_while_optimize_runs():
    from redline.optimize.report import LineProgress

    log, now = io.StringIO(), iter([0.0, 1.0, 2.5, 3.0, 4.0, 5.0])
    with LineProgress(log, clock=lambda: next(now)) as progress:
        progress.stage("evaluating (one model at a time)", 2)
        progress.advance(detail="original")
        progress.advance(detail="int8-dynamic: rejected")
        progress.stage("measuring latency (one session at a time)", 4)
    assert log.getvalue().splitlines() == [
        "[   1.0s] evaluating (one model at a time) (2 steps)",
        "[   2.5s] evaluating (one model at a time) 1/2: original",
        "[   3.0s] evaluating (one model at a time) 2/2: int8-dynamic: rejected",
        "[   4.0s] measuring latency (one session at a time) (4 steps)",
    ]


def test_user_eval_function_and_guard_metric_through_the_cli(repo, digits, digits_mlp, tmp_path,
                                                             capsys, monkeypatch):
    module = tmp_path / "my_metrics.py"
    module.write_text("import numpy as np\n\n"
                      "def top_class_share(y_true, scores, labels):\n"
                      "    return float(np.mean(np.asarray(labels) == np.asarray(y_true)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    data, train = tmp_path / "val.npz", tmp_path / "train.npz"
    np.savez(data, X=digits.x_val, y=digits.y_val)
    np.savez(train, X=digits.x_train, y=digits.y_train)
    code, out, err = run_cli(
        ["optimize", "-m", "digits", "--data", data, "--train-data", train, "-r", repo.root,
         "--techniques", "quantize", "--eval-fn", "my_metrics:top_class_share",
         "--guard-metric", "brier", "--calibration-rows", "128", "--per-tensor",
         "--reduce-range", "--calibration-methods", "minmax", "--no-register", "--json",
         "--fast", "--rounds", "20", "--passes", "2", "--bootstrap", "100"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["metric"] == "my_metrics:top_class_share" and report["guard_metric"] == "brier"
    static = next(c for c in report["candidates"] if c["name"].startswith("int8-static"))
    assert static["recipe"]["calibration_rows"] == 128
    assert static["recipe"]["per_channel"] is False and static["recipe"]["reduce_range"] is True
    assert "my_metrics:top_class_share" in static["intervals"]
    code, _, err = run_cli(["optimize", "-m", "digits", "--data", data, "-r", repo.root,
                            "--eval-fn", "my_metrics:nope"], capsys)
    assert code == 2 and "has no 'nope'" in err

