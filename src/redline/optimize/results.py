"""What ``redline optimize`` found: each candidate's measurements and judgements, and the
report of a whole run (what the CLI prints, the JSON and Markdown reports, and registration
read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from redline.optimize.candidates import Candidate, Skipped
from redline.optimize.contract import Contract
from redline.optimize.profile import Latency
from redline.optimize.uncertainty import Interval


@dataclass
class Judgement:
    """A candidate's relative loss against the original on one row set, with its interval."""

    loss: float
    interval: Interval
    guard_loss: float | None = None
    guard_interval: Interval | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"loss": round(self.loss, 6), "interval": self.interval.to_list()}
        if self.guard_loss is not None and self.guard_interval is not None:
            d["guard_loss"] = round(self.guard_loss, 6)
            d["guard_interval"] = self.guard_interval.to_list()
        return d


@dataclass
class CandidateResult:
    """One candidate as measured and judged: the original is one too, named ``original``."""

    name: str
    technique: str
    note: str
    recipe: dict[str, Any]
    settings: dict[str, Any]
    size_bytes: int
    n_parameters: int | None
    latency: dict[int, Latency]
    metrics: dict[str, float]  # evaluation rows
    intervals: dict[str, Interval]  # evaluation rows, 95%
    evaluation: Judgement
    choice: Judgement
    max_abs_diff: float
    disagreement: float
    within_tolerance: bool  # on the choice rows, by the interval's worse end
    verdict: str = ""  # ok | too lossy | uncertain | guard
    speedup: dict[int, float] = field(default_factory=dict)  # p50, paired by pass
    speedup_interval: dict[int, Interval] = field(default_factory=dict)  # 95%
    tied_with: str | None = None  # as fast as this candidate, within the machine's noise
    candidate: Candidate | None = field(default=None, repr=False)

    @property
    def metric_loss(self) -> float:
        return self.evaluation.loss

    def profile(self) -> dict[str, Any]:
        return {
            "latency": {str(b): lat.to_dict() for b, lat in self.latency.items()},
            "speedup": {str(b): round(s, 3) for b, s in self.speedup.items()},
            # null high end: one pass, nothing to pair (JSON has no infinity)
            "speedup_interval": {str(b): [round(i.low, 3),
                                          round(i.high, 3) if np.isfinite(i.high) else None]
                                 for b, i in self.speedup_interval.items()},
            "size_bytes": self.size_bytes,
            "parameters": self.n_parameters,
            "metrics": {k: round(v, 6) for k, v in self.metrics.items()},
            "intervals": {k: v.to_list() for k, v in self.intervals.items()},
            "metric_loss": round(self.metric_loss, 6),
            "evaluation": self.evaluation.to_dict(),
            "choice": self.choice.to_dict(),
            "max_abs_diff": self.max_abs_diff,
            "disagreement": round(self.disagreement, 6),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "technique": self.technique, "note": self.note,
                "recipe": self.recipe, "settings": self.settings,
                "within_tolerance": self.within_tolerance, "verdict": self.verdict,
                "tied_with": self.tied_with,
                **self.profile()}


@dataclass
class OptimizeReport:
    """A whole run: every candidate measured, those skipped or rejected, and the pick."""

    model: str
    version: int | None
    task: str
    metric: str
    tolerance: float
    batch_sizes: list[int]
    rows: dict[str, int]  # fit, choice, evaluation
    results: list[CandidateResult]
    skipped: list[Skipped]
    rejected: list[Skipped] = field(default_factory=list)
    guard_metric: str | None = None
    guard_tolerance: float | None = None
    measurement: str = ""
    chosen: str | None = None
    reason: str = ""
    registered: dict[str, Any] | None = None
    contract: Contract | None = None  # the original's, which every candidate kept
    metric_direction: int = 1  # +1: higher is better

    @property
    def eval_rows(self) -> int:
        return self.rows["evaluation"]

    @property
    def tune_rows(self) -> int:
        return self.rows["fit"]

    def result(self, name: str) -> CandidateResult:
        return next(r for r in self.results if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "version": self.version, "task": self.task,
            "metric": self.metric, "tolerance": self.tolerance,
            "guard_metric": self.guard_metric, "guard_tolerance": self.guard_tolerance,
            "batch_sizes": self.batch_sizes, "rows": self.rows, "measurement": self.measurement,
            "confidence": 0.95,
            "contract": self.contract.to_dict() if self.contract else None,
            "candidates": [r.to_dict() for r in self.results],
            "skipped": [{"name": s.name, "technique": s.technique, "reason": s.reason}
                        for s in self.skipped],
            "rejected": [{"name": s.name, "technique": s.technique, "reason": s.reason}
                         for s in self.rejected],
            "chosen": self.chosen, "reason": self.reason, "registered": self.registered,
        }
