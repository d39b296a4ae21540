"""What ``redline optimize`` is asked to do: the techniques it may try, its bounds and its
measurement, and where it reports its progress."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from redline.errors import InvalidInput
from redline.optimize.candidates import Candidate, QuantizationOptions, Skipped, TuneContext
from redline.optimize.distill import distill_candidates
from redline.optimize.graph import graph_candidates
from redline.optimize.prune import magnitude_candidates, structured_candidates
from redline.optimize.quantize import fp16_candidates, quantize_candidates
from redline.optimize.trees import tree_candidates
from redline.optimize.user_metric import UserMetric

Technique = Callable[[bytes, TuneContext], Iterator[Candidate | Skipped]]
TECHNIQUES: dict[str, Technique] = {
    "graph": graph_candidates,
    "quantize": quantize_candidates,
    "fp16": fp16_candidates,
    "prune": structured_candidates,
    "magnitude": magnitude_candidates,
    "trees": tree_candidates,
    "distill": distill_candidates,
}


class Progress(Protocol):
    """Where a run reports what it is doing: a stage (with its number of steps, if known) and
    each step as it finishes, with what it was (a candidate's name) for logs."""

    def stage(self, label: str, total: int | None = None) -> None: ...
    def advance(self, n: int = 1, detail: str = "") -> None: ...


class Silent:
    """A run's progress when no one watches."""

    def stage(self, label: str, total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1, detail: str = "") -> None:
        pass


@dataclass
class OptimizeOptions:
    techniques: list[str] = field(default_factory=lambda: list(TECHNIQUES))
    tolerance: float = 0.01  # largest relative loss in the metric (worse end of the interval)
    metric: str | None = None  # default: accuracy (classification) / rmse (regression)
    eval_fn: UserMetric | None = None  # a user's metric; replaces ``metric`` when given
    guard_metric: str | None = "auto"  # a second bound: auto = log loss for probabilities
    guard_tolerance: float = 0.10
    batch_size: int = 32  # the server's typical batch
    rounds: int = 300  # timed calls per candidate and batch size, over all passes
    passes: int = 5  # interleaved passes, each loading one session at a time
    max_seconds: float | None = 30.0  # per batch size, all candidates together
    fit_share: float = 1 / 3  # of --data, when no separate fit rows are given
    choice_share: float = 1 / 3
    bootstrap: int = 500
    seed: int = 0
    fast: bool = False
    rank_by: str = "p50"  # p50 | p99, at the typical batch size
    # the lower end of the speed-up's 95% interval must reach this, or the original stays
    min_speedup: float = 1.05
    quantization: QuantizationOptions = field(default_factory=QuantizationOptions)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.techniques) - set(TECHNIQUES))
        if unknown:
            raise InvalidInput(f"unknown technique(s) {unknown}; choose from {sorted(TECHNIQUES)}")
        if not (0.0 < self.fit_share and 0.0 < self.choice_share
                and self.fit_share + self.choice_share < 1.0):
            raise InvalidInput("the fit and choice shares must be positive and leave rows for "
                               "evaluation (fit + choice < 1)")
        if self.batch_size < 1 or self.rounds < 1 or self.passes < 1:
            raise InvalidInput("batch size, rounds and passes must be at least 1")
        if self.rank_by not in ("p50", "p99"):
            raise InvalidInput("rank-by must be p50 or p99")
        if self.quantization.calibration_rows < 1:
            raise InvalidInput("calibration rows must be at least 1")
        if self.bootstrap < 50:
            raise InvalidInput("use at least 50 bootstrap resamples")
