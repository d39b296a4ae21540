"""What every optimization technique produces (a ``Candidate`` or a ``Skipped`` with the reason)
and what it may learn from (``TuneContext``: the tuning split and the original's answers on it).

Techniques tune on the tuning split only; every figure in the report comes from the separate
evaluation split, so a technique cannot look good by fitting the rows it is judged on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from redline.config import RuntimeSettings
from redline.optimize.profile import (
    ModelRunner,
    Outputs,
    primary_metric,
    relative_loss,
    task_metrics,
)


@dataclass
class Candidate:
    """One way of running the model: ONNX bytes plus the runtime settings to run them with."""

    name: str
    technique: str  # original | graph | quantize | fp16 | prune | trees | distill
    onnx_bytes: bytes = field(repr=False)
    settings: dict[str, Any] = field(default_factory=dict)  # RuntimeSettings field overrides
    recipe: dict[str, Any] = field(default_factory=dict)  # how it was made, for metadata.extra
    note: str = ""
    n_parameters: int | None = None

    def runtime_settings(self, base: RuntimeSettings) -> RuntimeSettings:
        values = {**base.__dict__, **self.settings}
        return RuntimeSettings(**values)


@dataclass
class Skipped:
    """A technique that does not apply (or failed); the reason is shown in the report."""

    name: str
    technique: str
    reason: str


@dataclass
class TuneContext:
    """The tuning split, the original model's outputs on it, and the accuracy bound."""

    x: np.ndarray
    y: np.ndarray
    task: str
    class_labels: list[Any] | None
    teacher_runner: ModelRunner
    base_settings: RuntimeSettings
    metric: str  # '' means the task's default metric
    tolerance: float
    seed: int = 0
    fast: bool = False  # fewer epochs and variants: for tests and quick looks
    teacher: Outputs = field(init=False)
    baseline_metric: float = field(init=False)

    def __post_init__(self) -> None:
        self.metric = primary_metric(self.task, self.metric or None)
        self.teacher = self.teacher_runner.predict(self.x)
        self.baseline_metric = self._metric_of(self.teacher)

    def teacher_predict(self, x: np.ndarray) -> Outputs:
        """The original model's answers on any rows (soft targets for students, fine-tunes)."""
        return self.teacher_runner.predict(x)

    def _metric_of(self, out: Outputs) -> float:
        return task_metrics(self.task, out, self.y, self.class_labels).get(self.metric, np.nan)

    def loss_of(self, onnx_bytes: bytes, settings: dict[str, Any] | None = None) -> float:
        """Relative metric loss of a model on the tuning split (what techniques steer by)."""
        runner = ModelRunner(onnx_bytes, task=self.task, class_labels=self.class_labels,
                             settings=Candidate("t", "t", b"", settings or {})
                             .runtime_settings(self.base_settings), name="tuning")
        value = self._metric_of(runner.predict(self.x))
        return relative_loss(self.metric, self.baseline_metric, value)

    @property
    def cpu_count(self) -> int:
        if hasattr(os, "sched_getaffinity"):
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1
