"""What every optimization technique produces (a ``Candidate`` or a ``Skipped`` with the reason)
and what it may learn from (``TuneContext``).

Three row sets, never mixed: techniques *fit* on the fit rows (calibration, fine-tuning,
distillation), steer their own choices (which nodes stay in float, whether kept trees are
rescaled) and the optimizer picks among candidates on the *choice* rows, and every figure in
the report comes from the *evaluation* rows, which nothing learned from or chose on.
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
class QuantizationOptions:
    """What users of ONNX Runtime's quantizer, Neural Compressor and Optimum expect to set."""

    preprocess: bool = True  # onnxruntime.quantization.quant_pre_process first
    per_channel: bool | None = None  # None: per-tensor for dynamic, per-channel for static
    reduce_range: bool = False  # 7-bit weights (older CPUs without VNNI)
    calibration_rows: int = 512
    methods: tuple[str, ...] | None = None  # static calibration methods; None = all


@dataclass
class TuneContext:
    """The fit rows (finite only), the choice rows, the original model and the accuracy bound."""

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
    x_choice: np.ndarray | None = None  # None: judge on the fit rows (direct API use)
    y_choice: np.ndarray | None = None
    quantization: QuantizationOptions = field(default_factory=QuantizationOptions)
    missing_values: str = "reject"  # the original's policy, which every candidate must keep
    teacher: Outputs = field(init=False)
    baseline_metric: float = field(init=False)

    def __post_init__(self) -> None:
        self.metric = primary_metric(self.task, self.metric or None)
        if self.x_choice is None or self.y_choice is None:
            self.x_choice, self.y_choice = self.x, self.y
        self.teacher = self.teacher_runner.predict(self.x)
        self._teacher_choice = self.teacher_runner.predict(self.x_choice)
        self.baseline_metric = self._metric_of(self._teacher_choice, self.metric)

    def teacher_predict(self, x: np.ndarray) -> Outputs:
        """The original model's answers on any rows (soft targets for students, fine-tunes)."""
        return self.teacher_runner.predict(x)

    def _metric_of(self, out: Outputs, metric: str) -> float:
        assert self.y_choice is not None
        return task_metrics(self.task, out, self.y_choice, self.class_labels).get(metric, np.nan)

    def runner(self, onnx_bytes: bytes, settings: dict[str, Any] | None = None) -> ModelRunner:
        return ModelRunner(onnx_bytes, task=self.task, class_labels=self.class_labels,
                           settings=Candidate("t", "t", b"", settings or {})
                           .runtime_settings(self.base_settings), name="tuning")

    def choice_metric(self, onnx_bytes: bytes, metric: str) -> float:
        """A metric of a model on the choice rows (NaN when it does not apply)."""
        assert self.x_choice is not None
        return self._metric_of(self.runner(onnx_bytes).predict(self.x_choice), metric)

    def loss_of(self, onnx_bytes: bytes, settings: dict[str, Any] | None = None) -> float:
        """Relative metric loss of a model on the choice rows (what techniques steer by)."""
        assert self.x_choice is not None
        out = self.runner(onnx_bytes, settings).predict(self.x_choice)
        value = self._metric_of(out, self.metric)
        if not np.isfinite(out.scores).all() or not np.isfinite(value):
            return float("inf")  # a NaN answer is never "close enough"
        return relative_loss(self.metric, self.baseline_metric, value)

    @property
    def cpu_count(self) -> int:
        if hasattr(os, "sched_getaffinity"):
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1
