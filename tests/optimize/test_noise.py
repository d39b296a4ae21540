"""Optimization that does not register noise: speed-ups carry a paired interval whose lower end
decides, the original run the same way is never a candidate, candidates within noise of each
other are reported as tied, and the gate holds an identical build to the same standard."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from redline.optimize import OptimizeOptions, optimize
from redline.optimize import optimizer as optimizer_module
from redline.optimize.candidates import Candidate
from redline.optimize.gate import EXIT_SLOWDOWN, GateOptions, slowdown_check
from redline.optimize.optimizer import choose
from redline.optimize.profile import Latency
from redline.optimize.report import to_markdown
from tests.optimize.conftest import run_cli

DIGITS = list(range(10))
QUICK = dict(fast=True, rounds=30, passes=3, bootstrap=100)


def _relabelled(model: bytes, text: str) -> bytes:
    """The same graph with another doc string: other bytes, the same computation."""
    proto = onnx.load_from_string(model)
    proto.doc_string = text
    return proto.SerializeToString()


def _optimize_with(monkeypatch, model, digits, make, **options):
    monkeypatch.setitem(optimizer_module.TECHNIQUES, "test", make)
    return optimize(model, digits.x_val, digits.y_val, task="classification",
                    class_labels=DIGITS, tune=(digits.x_train, digits.y_train),
                    options=OptimizeOptions(**{"techniques": ["graph", "test"], **QUICK,
                                               **options}))


def test_the_original_run_the_same_way_is_never_a_candidate(digits, digits_mlp, onnx_of,
                                                            monkeypatch):
    model = onnx_of(digits_mlp, digits.x_train)

    def same(data, ctx):
        yield Candidate("copy", "prune", data, note="the original's own bytes")

    report = _optimize_with(monkeypatch, model, digits, same, min_speedup=0)
    names = {r.name for r in report.results}
    # lower graph levels than the configured 'all' run a less rewritten copy: never tried
    assert not names & {"graph-disable", "graph-basic", "graph-extended", "copy"}
    assert {r.technique for r in report.results} <= {"original", "graph"}
    reasons = {s.name: s.reason for s in report.skipped}
    assert "same model as the original, run the same way" in reasons["copy"]


def test_a_speedup_counts_by_the_lower_end_of_its_paired_interval(digits, digits_mlp, onnx_of,
                                                                  monkeypatch):
    model = onnx_of(digits_mlp, digits.x_train)

    def copy(data, ctx):
        yield Candidate("copy-a", "prune", _relabelled(data, "copy-a"), note="no change")

    report = _optimize_with(monkeypatch, model, digits, copy, min_speedup=0,
                            techniques=["test"])
    opts = OptimizeOptions(techniques=["test"], min_speedup=0, **QUICK)
    result = report.result("copy-a")
    for batch in report.batch_sizes:
        ci = result.speedup_interval[batch]
        assert ci.low < result.speedup[batch] < ci.high  # three passes never agree exactly
    assert report.chosen == "copy-a" and "95% interval" in report.reason
    # a threshold the point estimate clears but the interval's lower end does not
    big = max(report.batch_sizes)
    threshold = (result.speedup_interval[big].low + result.speedup[big]) / 2
    report.chosen = None
    assert choose(report, dataclasses.replace(opts, min_speedup=threshold)) is None
    assert report.chosen is None
    assert f"lower end to reach {threshold:.2f}x" in report.reason
    assert "the original stays" in report.reason
    saved = report.to_dict()["candidates"][1]
    assert saved["speedup_interval"][str(big)][0] <= saved["speedup"][str(big)]


def test_candidates_within_noise_are_reported_as_tied(digits, digits_mlp, onnx_of,
                                                      monkeypatch):
    model = onnx_of(digits_mlp, digits.x_train)

    def two_copies(data, ctx):
        for name in ("copy-b", "copy-a"):  # the same size: neither may win on noise
            yield Candidate(name, "prune", _relabelled(data, name), note="no change")

    report = _optimize_with(monkeypatch, model, digits, two_copies, min_speedup=0,
                            techniques=["test"])
    assert report.chosen == "copy-a"  # the tie is broken by a fixed rule, not by the timer
    assert report.result("copy-b").tied_with == "copy-a"
    assert "as fast within noise: copy-b" in report.reason
    assert "as fast as copy-a (within noise)" in to_markdown(report)


def test_the_slowdown_is_judged_on_its_paired_interval():
    # Timings of six passes of 60 calls, fixed here: measured ones may hold a noisy pass
    # already, and this is about how the check reads passes, not about this machine.
    rng = np.random.default_rng(0)
    baseline = Latency(1, rng.normal(100.0, 3.0, 360), np.repeat(np.arange(6), 60))
    noisy = baseline.samples_us * np.where(baseline.passes < 4, 1.6, 1.0)
    # four of the six passes met a noisy neighbour: the pooled median looks 1.6x slower
    candidate = Latency(1, noisy, baseline.passes)
    assert candidate.p50_us / baseline.p50_us > 1.2
    check = slowdown_check(candidate, baseline, GateOptions(max_slowdown=1.2))
    assert check.passed and check.interval is not None
    assert check.interval[0] <= 1.2 < check.interval[1]
    assert "failing only when the whole interval is above it" in check.message
    # slower in every pass: the whole interval is over the limit
    slow = Latency(1, baseline.samples_us * 1.6, baseline.passes)
    check = slowdown_check(slow, baseline, GateOptions(max_slowdown=1.2))
    assert check.passed is False and check.exit_code == EXIT_SLOWDOWN
    assert check.interval is not None and check.interval[0] > 1.2


def test_an_identical_build_passes_the_gate_with_defaults(repo, digits, digits_mlp,
                                                          digits_npz, capsys):
    repo.add_estimator("digits", digits_mlp, digits.x_train[:64])
    repo.promote("digits", 1)
    repo.add_onnx("digits", repo.model_path("digits", 1), class_labels=DIGITS)  # same bytes
    for _ in range(3):
        code, out, err = run_cli(["gate", "-m", "digits", "--candidate", "2", "--data",
                                  digits_npz, "-r", repo.root, "--rounds", "100"], capsys)
        assert code == 0, err
        assert "[ok] candidate median latency is" in out and "over 10 passes" in out

    code, _, err = run_cli(["gate", "-m", "digits", "--candidate", "2", "--data", digits_npz,
                            "-r", repo.root, "--passes", "1"], capsys)
    assert code == 2 and "needs at least 2 passes" in err
