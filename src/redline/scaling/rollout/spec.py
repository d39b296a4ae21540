"""A rollout as the rollout file stores it, and the file itself.

The rollout file (``scaling.rollout_file``) is the one place a rollout's state lives: the
commands write it, every server process polls it, and the first process to condemn a
candidate writes the rollback there for all the others to follow.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redline.config import ScalingSettings
from redline.errors import InvalidInput, NotFound

ACTIVE = "running"
_DEFAULTS = ScalingSettings()  # config/settings.py holds every default


@dataclass
class RolloutSpec:
    """One model's rollout, as stored in the rollout file."""

    model: str
    baseline: int
    candidate: int
    mode: str = "canary"  # canary | shadow
    percent: float = 10.0
    sticky: bool = False
    min_requests: int = _DEFAULTS.rollout_min_requests
    max_error_rate_delta: float = _DEFAULTS.rollout_max_error_rate_delta
    max_p99_ratio: float = _DEFAULTS.rollout_max_p99_ratio
    min_p99_delta_ms: float = 1.0
    shadow_max_in_flight: int = 4
    min_answers: int = _DEFAULTS.rollout_min_answers
    max_prediction_psi: float = _DEFAULTS.rollout_max_prediction_psi
    max_mismatch_rate: float = _DEFAULTS.rollout_max_mismatch_rate
    answer_rtol: float = _DEFAULTS.rollout_answer_rtol
    answer_atol: float = _DEFAULTS.rollout_answer_atol
    min_labels: int = _DEFAULTS.rollout_min_labels
    max_loss_increase: float = _DEFAULTS.rollout_max_loss_increase
    state: str = ACTIVE  # running | promoted | aborted | rolled_back
    reason: str = ""
    failed_check: str = ""  # errors | latency | predictions | mismatch | labels
    started: float = field(default_factory=time.time)

    def check(self) -> None:
        if self.mode not in ("canary", "shadow"):
            raise InvalidInput(f"rollout mode must be canary or shadow, got {self.mode!r}")
        if not 0 < self.percent <= 100:
            raise InvalidInput(f"--percent must be in (0, 100], got {self.percent}")
        if self.candidate == self.baseline:
            raise InvalidInput(f"candidate version {self.candidate} is already the baseline")
        for flag, value in (("--min-requests", self.min_requests),
                            ("--min-answers", self.min_answers),
                            ("--min-labels", self.min_labels)):
            if value < 1:
                raise InvalidInput(f"{flag} must be at least 1 (too few answers never "
                                   f"decide), got {value}")
        if not 0 <= self.max_mismatch_rate <= 1:
            raise InvalidInput(f"--max-mismatch-rate must be in [0, 1] (1 turns the check "
                               f"off), got {self.max_mismatch_rate}")
        bound: float
        for flag, bound in (("--max-prediction-psi", self.max_prediction_psi),
                            ("--max-loss-increase", self.max_loss_increase),
                            ("--max-error-rate-delta", self.max_error_rate_delta),
                            ("--max-p99-ratio", self.max_p99_ratio),
                            ("scaling.rollout_answer_rtol", self.answer_rtol),
                            ("scaling.rollout_answer_atol", self.answer_atol)):
            if not (bound >= 0 and math.isfinite(bound)):
                raise InvalidInput(f"{flag} must be a finite number >= 0, got {bound}")


class RolloutFile:
    """Read and write the rollouts document atomically (write a temp file, then rename)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self) -> dict[str, RolloutSpec]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"rollout file {self.path} is unreadable: {exc}") from None
        return {name: RolloutSpec(**spec) for name, spec in doc.get("rollouts", {}).items()}

    def write(self, rollouts: dict[str, RolloutSpec]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"rollouts": {n: asdict(s) for n, s in rollouts.items()}},
                                  indent=2))
        tmp.replace(self.path)

    def update(self, name: str, **changes: Any) -> RolloutSpec:
        rollouts = self.read()
        spec = rollouts.get(name)
        if spec is None:
            raise NotFound(f"no rollout for model '{name}' (start one with `redline rollout "
                           f"start -m {name} --candidate N`)")
        for key, value in changes.items():
            setattr(spec, key, value)
        self.write(rollouts)
        return spec

    @property
    def stats_dir(self) -> Path:
        """Where each process writes its counts (``<file>.stats/<instance>.json``)."""
        return self.path.with_name(self.path.name + ".stats")


def rollout_path(settings: Any) -> Path:
    """``scaling.rollout_file``; left at its default, it lives in the project folder."""
    path = settings.scaling.rollout_file
    return Path(path) if path else Path(settings.project) / "rollout.json"
