"""Request budgets and admission: refuse early what cannot be served in time.

A deadline is an absolute ``time.perf_counter()`` value. It comes from the header
``x-redline-budget-ms``, the gRPC deadline, or the model's objective (``slo_ms``), in that order.
Admission compares the deadline with the batcher's estimate of when the request would finish
given the rows already queued; a request that cannot make it is refused at once with a
Retry-After instead of timing out late, and one whose budget runs out while queued is dropped
before it reaches the model. Both are counted here for the metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redline.errors import InvalidInput

BUDGET_HEADER = b"x-redline-budget-ms"
PRIORITY_HEADER = b"x-redline-priority"
now = time.perf_counter

# Priorities the batcher knows: HIGH requests leave the queue before any LOW one.
HIGH, LOW = 0, 1


def deadline_from_ms(budget_ms: float, start: float | None = None) -> float:
    return (start if start is not None else now()) + budget_ms / 1000.0


def parse_budget(value: bytes | str | None, default_ms: float, start: float) -> float:
    """The absolute deadline for a header value (milliseconds), or the default budget."""
    if value is None:
        return start + default_ms / 1000.0
    try:
        budget = float(value)
    except ValueError:
        raise InvalidInput(
            f"x-redline-budget-ms must be a number of milliseconds, got {value!r}"
        ) from None
    if not budget > 0 or budget == float("inf"):
        raise InvalidInput(f"x-redline-budget-ms must be a positive number, got {value!r}")
    return start + budget / 1000.0


def parse_priority(value: bytes | str | int | None) -> int:
    """``high``/``1`` → HIGH; ``low``/``0``/absent → LOW."""
    if value is None:
        return LOW
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    text = str(value).strip().lower()
    if text in ("high", "1", "true"):
        return HIGH
    if text in ("low", "0", "false", "normal", ""):
        return LOW
    raise InvalidInput(f"priority must be 'high' or 'low', got {value!r}")


@dataclass
class AdmissionStats:
    """Counts kept per model for the metrics: what was refused, dropped, served."""

    admitted: int = 0
    shed_queue_full: int = 0  # refused: queue at max_queue_size
    shed_budget: int = 0  # refused: predicted finish after the deadline
    expired: int = 0  # dropped: budget ran out while queued
    served: int = 0
    batches: int = 0
    rows: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class CostModel:
    """Predicts a batch's run time as ``fixed + per_row * rows`` from what runs have cost.

    Seeded from warm-up timings, then tracked with an exponentially weighted average so the
    estimate follows the machine's real speed (other load, thermal throttling).
    """

    __slots__ = ("fixed_s", "per_row_s", "alpha")

    def __init__(self, fixed_s: float = 0.0, per_row_s: float = 0.0, alpha: float = 0.1) -> None:
        self.fixed_s = fixed_s
        self.per_row_s = per_row_s
        self.alpha = alpha

    def seed(self, t1_s: float, tn_s: float, n: int) -> None:
        """From the run time of 1 row and of ``n`` rows."""
        self.per_row_s = max(0.0, (tn_s - t1_s) / max(1, n - 1))
        self.fixed_s = max(0.0, t1_s - self.per_row_s)

    def observe(self, rows: int, seconds: float) -> None:
        sample = max(0.0, (seconds - self.fixed_s) / max(1, rows))
        # One run stalled by the OS (preempted, page fault) must not swing the estimate: a
        # sample counts for at most twice the current estimate, so a real slowdown is followed
        # within a few dozen runs and a blip is ignored.
        if self.per_row_s > 0:
            sample = min(sample, 2.0 * self.per_row_s + 1e-6)
        self.per_row_s += self.alpha * (sample - self.per_row_s)

    def predict(self, rows: int) -> float:
        return self.fixed_s + self.per_row_s * rows
