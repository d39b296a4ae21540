"""Request budgets and admission: refuse early what cannot be served in time.

A request's :class:`Budget` holds an absolute ``time.perf_counter()`` deadline. It comes from the
header ``x-redline-budget-ms`` (gRPC metadata of the same name), ``/v1``'s ``budget_ms`` field,
the gRPC deadline, or the model's objective (``slo_ms``), and is parsed and validated in one
function, :func:`parse_budget`, whatever the API and transport.
Admission compares the deadline with the batcher's estimate of when the request would finish
given the rows already queued; a request that cannot make it is refused at once with a
Retry-After instead of timing out late, and one whose budget runs out while queued is dropped
before it reaches the model. Both are counted here for the metrics.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import orjson

from redline.errors import DeadlineExceeded, InvalidBudget, InvalidInput

BUDGET_HEADER = b"x-redline-budget-ms"
PRIORITY_HEADER = b"x-redline-priority"
now = time.perf_counter

# Priorities the batcher knows: HIGH requests leave the queue before any LOW one.
HIGH, LOW = 0, 1


# The largest budget a client may ask for: ten minutes. Anything larger is a mistake (a budget in
# microseconds, a timestamp) and is refused; a gRPC deadline beyond it is capped instead, since
# clients set long deadlines by habit.
MAX_BUDGET_MS = 600_000.0
# Where a budget came from, as error messages name it.
FROM_HEADER = "header x-redline-budget-ms"
FROM_METADATA = "gRPC metadata x-redline-budget-ms"
FROM_BODY = "body field budget_ms"
FROM_GRPC_FIELD = "field budget_ms"
FROM_GRPC_DEADLINE = "gRPC deadline"
FROM_SLO = "model slo_ms"
# What a timer wake-up can add to a wait (uvloop's resolution is 1 ms): reserved when a stage
# asks whether it still fits, so a wait cut short still answers by the deadline.
TIMER_SLACK_S = 0.001


def deadline_from_ms(budget_ms: float, start: float | None = None) -> float:
    return (start if start is not None else now()) + budget_ms / 1000.0


class Budget:
    """A request's time: when it started, when it must be answered, and where that came from.

    Built once per request by :func:`parse_budget`; every stage asks it what is left.
    """

    __slots__ = ("start", "deadline", "ms", "source")

    def __init__(self, start: float, ms: float, source: str) -> None:
        self.start = start
        self.ms = ms
        self.deadline = start + ms / 1000.0
        self.source = source

    def left(self) -> float:
        """Seconds left (negative once spent)."""
        return self.deadline - now()

    def fits(self, p99_s: float, slack_s: float = TIMER_SLACK_S) -> bool:
        """Whether a stage whose recent p99 is ``p99_s`` still fits, with timer slack reserved."""
        return self.deadline - now() >= p99_s + slack_s

    def wait_for(self, reserve_s: float, floor_s: float = 0.0005) -> float:
        """How long a stage may wait, leaving ``reserve_s`` (and timer slack) for what follows."""
        return max(floor_s, self.deadline - now() - reserve_s - TIMER_SLACK_S)

    def __repr__(self) -> str:
        return f"Budget({self.ms:g} ms from {self.source})"


def parse_budget(value: bytes | str | float | int | None, source: str, *, default_ms: float,
                 start: float) -> Budget:
    """The request's :class:`Budget`: the one place a budget is read and validated.

    ``value`` is what the client sent (a header or metadata string, a JSON or protobuf number,
    a gRPC deadline in milliseconds); ``None`` means it sent none, and the model's SLO applies.
    Negative, zero, NaN, infinite, absurdly large and non-numeric values (in a JSON body, a
    string, list or object too) are refused with an :class:`InvalidBudget` naming ``source``,
    identically on every API and transport.
    """
    if value is None:
        return Budget(start, default_ms, FROM_SLO)
    if isinstance(value, bool):
        ms = math.nan  # JSON true/false is not a number of milliseconds
    elif isinstance(value, int | float):
        ms = float(value)
    elif source == FROM_BODY or not isinstance(value, bytes | str):
        ms = math.nan  # a JSON field is a number: a string, list or object there is a mistake
    else:
        try:
            ms = float(value)  # a header's text; float() also reads other scripts' digits
        except ValueError:
            ms = math.nan
    if source == FROM_GRPC_DEADLINE:
        if ms <= 0:
            raise DeadlineExceeded("the gRPC deadline had passed when the request arrived")
        return Budget(start, min(ms, MAX_BUDGET_MS), source)
    if not 0 < ms <= MAX_BUDGET_MS:  # False for NaN too
        raise InvalidBudget(
            f"the budget ({source}) must be a number of milliseconds greater than 0 and at "
            f"most {MAX_BUDGET_MS:.0f}, got {_show(value)}", source=source)
    return Budget(start, ms, source)


def _show(value: object) -> str:
    text = value.decode("latin-1", "replace") if isinstance(value, bytes) else value
    shown = repr(text) if isinstance(text, str | int | float) else _json(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _json(value: object) -> str:
    """A JSON value as the client wrote it (a list or an object sent as a budget)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return type(value).__name__


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
