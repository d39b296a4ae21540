"""The examples in the drift modules' docstrings run, and say what the code does."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest

from redline.monitoring.drift import calibration, stats, window


@pytest.mark.parametrize("module", [stats, calibration, window], ids=lambda m: m.__name__)
def test_docstring_examples(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0, f"{module.__name__} lost its examples"
    assert result.failed == 0
