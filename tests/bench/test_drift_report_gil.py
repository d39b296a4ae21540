"""The drift-report benchmark runs this checkout's monitor against a commit's (here HEAD's, the
one commit every clone has), each making the same report of the same window."""

from __future__ import annotations

import re

import pytest

from benchmarks.observability.drift_report_gil import main, monitor_at, ready
from redline.monitoring.drift import DriftMonitor


def test_a_commits_monitor_reports_as_this_one_does() -> None:
    at_head, here = ready(monitor_at("HEAD"), 4, 600), ready(DriftMonitor, 4, 600)
    assert at_head is not here and type(at_head) is not DriftMonitor
    a, b = at_head.report(), here.report()
    a["window"].pop("since"), b["window"].pop("since")
    assert a == b and len(a["features"]) == 4


def test_each_turn_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--against", "HEAD", "--features", "3", "--window", "500",
                 "--seconds", "0.2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"ms a report, .* switches a report, spinner", out)) == 2
    assert out.count("ms of CPU a report alone") == 2
