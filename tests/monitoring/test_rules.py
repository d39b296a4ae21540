"""The Prometheus alert rules pass promtool's checks and their own unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run `bash tools/services.d/40-promtool.sh` "
                    "(Debian package prometheus)")
    return path


@pytest.mark.slow
def test_rules_are_valid() -> None:
    out = subprocess.run([promtool(), "check", "rules", "redline-rules.yml"], cwd=RULES,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 19 rules found" in out.stdout


@pytest.mark.slow
def test_rule_unit_tests_pass() -> None:
    out = subprocess.run([promtool(), "test", "rules", "redline-rules.test.yml"], cwd=RULES,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
