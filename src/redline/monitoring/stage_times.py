"""The flat buffer of stage times the serving path fills for common requests (``StageTimes``).

One per (model, version), handed out by the monitor's feed; the tick takes its integers and
folds them into the metrics and the slow log (``ServerMonitor.fold_times``) with numpy, many
requests at once. What a request leaves here and why: ``serving/stages.py``'s ``StageTimes``.
"""

from __future__ import annotations

import math
import random
import time

NEVER = 1 << 62  # the serving side's ``stages.NEVER``: never reached
FIELDS = 5  # start, decoded, inferred, end, rows (``stages.TIME_FIELDS``)


class StageTimesBuffer:
    """``times`` (five integers a request), the trace threshold and the head-sample countdown.

    The countdown is a geometric gap: each request is in the head sample with probability
    ``sample_ratio``, independently, as one random draw per request would give, for one integer
    decrement a request instead of a draw."""

    __slots__ = ("times", "slow_ns", "countdown", "sample_ratio")

    def __init__(self, slow_ns: int = NEVER, sample_ratio: float = 0.0) -> None:
        self.times: list[int] = []
        self.slow_ns = slow_ns
        self.sample_ratio = sample_ratio
        self.countdown = self.gap()

    def gap(self) -> int:
        """Requests until the next one in the head sample (1: the next), drawn anew."""
        ratio = self.sample_ratio
        if ratio >= 1.0:
            return 1
        if ratio <= 0.0:
            return NEVER
        return int(math.log(1.0 - random.random()) / math.log1p(-ratio)) + 1

    def retune(self, slow_ns: int, sample_ratio: float) -> None:
        """New tracing settings (tracing switched on): the countdown starts over."""
        self.slow_ns, self.sample_ratio = slow_ns, sample_ratio
        self.countdown = self.gap()

    def take(self, limit: int | None = None) -> list[int]:
        """Up to ``limit`` requests' integers, oldest first (on the loop's thread, as the
        request path that appends)."""
        times = self.times
        if limit is None or len(times) <= limit * FIELDS:
            self.times = []
            return times
        n = limit * FIELDS
        taken = times[:n]
        del times[:n]
        return taken


class FlatRecord:
    """A common request's slow-log entry, remade from its flat stage times: what
    ``metrics.describe`` reads of a ``RequestRecord`` (answered ok, on the primary path, with
    no request id or caller ``traceparent``: the requests that leave flat times)."""

    __slots__ = ("api", "transport", "model", "version", "start_ns", "end_ns", "rows", "spans",
                 "wall_ns")
    path = "primary"
    status = "ok"
    request_id = ""
    traceparent = None

    def __init__(self, api: str, transport: str, model: str, version: str,
                 row: list[int]) -> None:
        start, decoded, inferred, end, rows = row
        self.api, self.transport, self.model, self.version = api, transport, model, version
        self.start_ns, self.end_ns, self.rows = start, end, rows
        self.spans = [("decode", start, decoded), ("inference", decoded, inferred),
                      ("encode", inferred, end)]
        # made within a tick of the request: the clocks' offset now is the offset then
        self.wall_ns = start + (time.time_ns() - time.perf_counter_ns())

    @property
    def total_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1000.0

    def timings_us(self) -> dict[str, int]:
        out = {name: (end - start) // 1000 for name, start, end in self.spans}
        out["total"] = int(self.total_us)
        return out
