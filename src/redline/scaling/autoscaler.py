"""How many workers to run, from queue depth and latency against the objective.

``decide`` is a pure function of what was observed and when the last change happened, so a
surge and a lull can be replayed in a test tick by tick. Up is quick (a short cool-down, and the
step grows with the overload); down is slow (a long cool-down, one worker at a time), so a burst
followed by a gap does not make the pool flap.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

log = logging.getLogger("redline.scaling")


@dataclass(frozen=True)
class ScalePolicy:
    min_workers: int
    max_workers: int
    objective_p99_ms: float
    queue_high: float = 4.0  # in-flight requests per worker that call for more workers
    queue_low: float = 0.5  # below this (and a p99 well inside the objective) one may go
    up_cooldown_s: float = 5.0
    down_cooldown_s: float = 30.0


@dataclass(frozen=True)
class LoadSample:
    """What the workers report at one tick: total in flight, and the worst recent p99."""

    workers: int
    in_flight: float
    p99_ms: float


@dataclass(frozen=True)
class Decision:
    target: int
    reason: str

    def direction(self, current: int) -> str:
        return "up" if self.target > current else "down" if self.target < current else "hold"


def decide(policy: ScalePolicy, sample: LoadSample, now: float, last_change: float) -> Decision:
    """The worker count to run next (``last_change``: when the count last changed)."""
    n = sample.workers
    per_worker = sample.in_flight / max(1, n)
    since = now - last_change
    slow = sample.p99_ms > policy.objective_p99_ms
    if (per_worker > policy.queue_high or slow) and n < policy.max_workers:
        if since < policy.up_cooldown_s:
            return Decision(n, f"hold: wants more but scaled {since:.1f}s ago")
        # Enough workers to bring the queue back to the high mark, at least one more.
        wanted = math.ceil(sample.in_flight / policy.queue_high) if per_worker > policy.queue_high \
            else n + 1
        target = min(policy.max_workers, max(n + 1, wanted))
        why = (f"queue {per_worker:.1f}/worker > {policy.queue_high}" if not slow
               else f"p99 {sample.p99_ms:.1f} ms > objective {policy.objective_p99_ms} ms")
        return Decision(target, f"up: {why}")
    if n < policy.min_workers:
        return Decision(policy.min_workers, "up: below the minimum")
    if n > policy.max_workers:
        return Decision(policy.max_workers, "down: above the maximum")
    quiet = per_worker < policy.queue_low and sample.p99_ms < policy.objective_p99_ms / 2
    if quiet and n > policy.min_workers:
        if since < policy.down_cooldown_s:
            return Decision(n, f"hold: quiet but scaled {since:.1f}s ago")
        return Decision(n - 1, f"down: queue {per_worker:.2f}/worker < {policy.queue_low}")
    return Decision(n, "hold: within bounds")


@dataclass
class Autoscaler:
    """Applies ``decide`` tick by tick, remembering the last change; logs and counts decisions."""

    policy: ScalePolicy
    last_change: float = float("-inf")
    counts: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0, "hold": 0})
    history: list[tuple[float, int, int, str]] = field(default_factory=list)

    def tick(self, sample: LoadSample, now: float) -> Decision:
        decision = decide(self.policy, sample, now, self.last_change)
        direction = decision.direction(sample.workers)
        self.counts[direction] += 1
        if direction != "hold":
            self.last_change = now
            self.history.append((now, sample.workers, decision.target, decision.reason))
            log.info("autoscale %s -> %s workers: %s", sample.workers, decision.target,
                     decision.reason)
        return decision
