"""`make demo` end to end at a small size: the session's one run (the doc pages start from it
too), read for what it registered and what it printed."""

from __future__ import annotations

import re

import pytest

from redline.models import ModelRepository
from tests.conftest import SmallDemo, keep_drift_thresholds

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def printed(demo: SmallDemo) -> str:
    """The demo's output as one line (the console wraps long lines at its width)."""
    return " ".join(demo.output.split())


def test_engine_step_registers_and_measures(small_demo: SmallDemo) -> None:
    repo = ModelRepository(small_demo.project / ".redline" / "models")
    assert "breast_cancer" in repo.list_models()
    assert repo.aliases("breast_cancer") == {"production": 1}
    meta = repo.metadata("breast_cancer")
    assert meta.metrics["roc_auc"] > 0.95 and meta.feature_names and len(meta.feature_names) == 30
    # both engines were timed: the ratio of their medians is printed
    assert re.search(r"redline's engine is \d+x faster at the median", printed(small_demo)), \
        small_demo.output[-3000:]


def test_every_version_keeps_its_drift_thresholds(small_demo: SmallDemo) -> None:
    """The demo waits for each version's drift calibration before its server stops, so a
    server of its repository (every doc page's) reads the thresholds instead of spending
    seconds of CPU on them again: a server with default settings takes them from the file."""
    sources = keep_drift_thresholds(small_demo.project / ".redline" / "models")
    assert sources["breast_cancer:1"] == sources["fraud:1"] == "file", sources
