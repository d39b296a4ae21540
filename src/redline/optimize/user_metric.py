"""A user's own evaluation function, named as a Python entry point (``package.module:function``).

Neural Compressor and Optimum take an ``eval_func``; here the function gets the rows' labels and
one model's answers and returns one number::

    def business_value(y_true, scores, labels):
        # y_true: labels or targets; scores: [rows, columns] float64 (probabilities for
        # classifiers); labels: predicted labels (classifiers) or None
        return float(...)

It becomes the metric that decides "within tolerance", with bootstrap intervals like the built-in
ones (it is called once per resample, so keep it cheap).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from redline.errors import InvalidInput


@dataclass(frozen=True)
class UserMetric:
    name: str  # the entry point, shown in reports
    function: Callable[[np.ndarray, np.ndarray, np.ndarray | None], float]
    higher_is_better: bool = True

    @property
    def direction(self) -> int:
        return 1 if self.higher_is_better else -1

    def __call__(self, y: np.ndarray, scores: np.ndarray, labels: np.ndarray | None) -> float:
        try:
            value = float(self.function(y, scores, labels))
        except Exception as exc:  # a user's bug must read as theirs, with where it came from
            raise InvalidInput(f"evaluation function {self.name} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        return value


def load_user_metric(entry_point: str, *, higher_is_better: bool = True) -> UserMetric:
    """Import ``module:function``; a clear error when it cannot be found or is not callable."""
    module_name, sep, attr = entry_point.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidInput(f"--eval-fn {entry_point!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"--eval-fn: cannot import module '{module_name}' ({exc}); is it on "
                           "PYTHONPATH?") from exc
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise InvalidInput(f"--eval-fn: module '{module_name}' has no '{attr}'")
    if not callable(target):
        raise InvalidInput(f"--eval-fn: '{entry_point}' is not callable")
    return UserMetric(entry_point, target, higher_is_better)
