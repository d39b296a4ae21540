"""A circuit breaker around the online store, so a dead Redis costs no time per request.

Closed: calls go through; ``failure_threshold`` consecutive failures open it. Open: ``allow()``
says no at once (the caller degrades to the near cache or defaults) until ``reset_s`` has passed.
Half-open: one probe call is let through; its success closes the breaker, its failure opens it
again with the wait doubled (up to ``max_reset_s``), so a long outage is probed rarely and a short
one recovers within a fraction of a second.
"""

from __future__ import annotations

import time

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    """Consecutive-failure breaker with automatic half-open recovery (one probe at a time)."""

    __slots__ = ("failure_threshold", "reset_s", "max_reset_s", "state", "failures",
                 "opened_at", "wait_s", "probing", "opens", "rejected", "clock")

    def __init__(self, failure_threshold: int = 3, reset_s: float = 0.25,
                 max_reset_s: float = 2.0, clock: object = time.monotonic) -> None:
        self.failure_threshold = max(1, failure_threshold)
        self.reset_s = reset_s
        self.max_reset_s = max(reset_s, max_reset_s)
        self.clock = clock
        self.state = CLOSED
        self.failures = 0
        self.opened_at = 0.0
        self.wait_s = reset_s
        self.probing = False
        self.opens = 0  # times it opened, for the metrics
        self.rejected = 0  # calls refused while open

    def allow(self) -> bool:
        """Whether to try the store now; refusals cost a comparison, nothing more."""
        state = self.state
        if state == CLOSED:
            return True
        if state == OPEN:
            if self.clock() - self.opened_at < self.wait_s:  # type: ignore[operator]
                self.rejected += 1
                return False
            self.state = HALF_OPEN
            self.probing = False
        # Case: half-open — one probe in flight at a time, the others degrade.
        if self.probing:
            self.rejected += 1
            return False
        self.probing = True
        return True

    def success(self) -> None:
        if self.state != CLOSED:
            self.state = CLOSED
            self.wait_s = self.reset_s
        self.failures = 0
        self.probing = False

    def failure(self) -> None:
        self.probing = False
        if self.state == HALF_OPEN:
            # Case: the probe failed — open again, wait longer.
            self.wait_s = min(self.max_reset_s, self.wait_s * 2)
            self._open()
            return
        self.failures += 1
        if self.failures >= self.failure_threshold and self.state == CLOSED:
            self._open()

    def _open(self) -> None:
        self.state = OPEN
        self.opened_at = self.clock()  # type: ignore[operator]
        self.opens += 1

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "consecutive_failures": self.failures, "opens": self.opens,
                "rejected": self.rejected}
