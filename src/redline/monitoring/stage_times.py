"""The flat buffer of stage times the serving path fills for common requests (``StageTimes``).

One per (model, version), handed out by the monitor's feed; the tick takes its integers and
folds them into the metrics and the slow log (``ServerMonitor.fold_times``) with numpy, many
requests at once. What a request leaves here and why: ``serving/stages.py``'s ``StageTimes``.

Why the integers do not wait a whole tick as Python ints: a second of requests' ints (four or
more new ones a request, megabytes at capacity) kept alive until the tick makes every
allocation walk fresh memory, which pushes the request path's own working set (ONNX Runtime,
numpy, the HTTP objects) out of the CPU's cache: at capacity, keeping them so cost 5-10% of
a V2 or ``/v1`` request's CPU, spread over all the code it runs. So every ``SPILL_ROWS``
requests the request path hands its list to ``spill()``, which packs it into one int64
array; the ints die young, their memory is reused while it is still in cache
(``benchmarks/observability/capacity.py``, docs/observability.md).
"""

from __future__ import annotations

import math
import random
import time

import numpy as np

NEVER = 1 << 62  # the serving side's ``stages.NEVER``: never reached
FIELDS = 5  # start, decoded, inferred, end, rows (``stages.TIME_FIELDS``)
# ``/v1`` rows (``stages.v1_times``): start, end, rows, path, feature age ns, then ns a stage
PATHS = ("primary", "fallback", "cache", "default")  # ``stages.PATHS``
V1_STAGES = ("decode", "features", "sessions", "admission", "query", "retrieve", "rank", "queue",
             "inference", "rules")
V1_FIELDS = 5 + len(V1_STAGES)  # ``stages.V1_TIME_FIELDS``
WIDTH = {"v2": FIELDS, "v1": V1_FIELDS}  # integers a request, by API
SPILL_ROWS = 256  # requests whose ints a buffer holds before packing them (module doc)


class StageTimesBuffer:
    """``times`` (``width`` integers a request; packed by ``spill()`` once ``spill_at`` long),
    the trace threshold and the head-sample countdown.

    The countdown is a geometric gap: each request is in the head sample with probability
    ``sample_ratio``, independently, as one random draw per request would give, for one integer
    decrement a request instead of a draw."""

    __slots__ = ("times", "spill_at", "_packed", "samples", "slow_ns", "countdown",
                 "sample_ratio", "width", "steps")

    def __init__(self, slow_ns: int = NEVER, sample_ratio: float = 0.0,
                 width: int = FIELDS, steps: tuple[str, ...] = ()) -> None:
        self.width = width + len(steps)
        self.times: list[int] = []
        self.spill_at = SPILL_ROWS * self.width  # the request path calls spill() at this length
        self._packed: list[np.ndarray] = []  # earlier requests' ints, spilled
        # The monitoring windows' sample among these requests (``/v1``): inputs, outputs,
        # inputs, ... -- the arrays alone, so a sampled request needs no record either.
        self.samples: list[object] = []
        # A graph's V2 rows: after the five fields, the ns in each of these stages
        # (``step:<name>``, in the graph's order; -1: the request did not run it).
        self.steps = steps
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

    def take_samples(self) -> list[object]:
        """The windows' sampled arrays so far (inputs, outputs, ...), oldest first."""
        samples = self.samples
        if samples:
            self.samples = []
        return samples

    def spill(self) -> None:
        """Pack the ints in ``times`` into one int64 array and start a new list (called by the
        request path when ``times`` reaches ``spill_at``)."""
        self._packed.append(np.array(self.times, dtype=np.int64))
        self.times = []

    def held(self) -> int:
        """How many requests' integers wait for the next ``take``."""
        return (len(self.times) + sum(len(a) for a in self._packed)) // self.width

    def take(self) -> np.ndarray:
        """Every request's integers so far, oldest first, as one flat int64 array (empty:
        none), the buffer emptied (on the loop's thread, as the request path that appends)."""
        if self.times:
            self.spill()
        packed = self._packed
        if not packed:
            return np.empty(0, dtype=np.int64)
        self._packed = []
        return packed[0] if len(packed) == 1 else np.concatenate(packed)


class FlatRecord:
    """A common request's slow-log entry, remade from its flat stage times: what
    ``metrics.describe`` reads of a ``RequestRecord`` (answered ok, with no request id or
    caller ``traceparent``: the requests that leave flat times). Made by ``v2_record`` and
    ``v1_record`` from a row of each API's layout."""

    __slots__ = ("api", "transport", "model", "version", "start_ns", "end_ns", "rows", "spans",
                 "path", "wall_ns")
    status = "ok"
    request_id = ""
    traceparent = None

    def __init__(self, api: str, transport: str, model: str, version: str, start: int, end: int,
                 rows: int, spans: list[tuple[str, int, int]], path: str = "primary") -> None:
        self.api, self.transport, self.model, self.version = api, transport, model, version
        self.start_ns, self.end_ns, self.rows, self.spans, self.path = start, end, rows, spans, path
        # made within a tick of the request: the clocks' offset now is the offset then
        self.wall_ns = start + (time.time_ns() - time.perf_counter_ns())

    @property
    def total_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1000.0

    def timings_us(self) -> dict[str, int]:
        out = {name: (end - start) // 1000 for name, start, end in self.spans}
        out["total"] = int(self.total_us)
        return out


def v2_record(transport: str, model: str, version: str, row: list[int],
              steps: tuple[str, ...] = ()) -> FlatRecord:
    """A V2 row (start, decoded, inferred, end, rows, then a graph's ``steps``' ns) as a
    slow-log entry; a graph's steps laid end to end from the decode, in the graph's order."""
    start, decoded, inferred, end, rows = row[:FIELDS]
    spans = [("decode", start, decoded)]
    at = decoded
    for stage, ns in zip(steps, row[FIELDS:], strict=True):
        if ns >= 0:
            spans.append((stage, at, at + ns))
            at += ns
    spans += [("inference", decoded, inferred), ("encode", inferred, end)]
    return FlatRecord("v2", transport, model, version, start, end, rows, spans)


def v1_record(transport: str, model: str, version: str, row: list[int]) -> FlatRecord:
    """A ``/v1`` row as a slow-log entry: its stages laid end to end from the start, in
    the order a request meets them (a stage passed twice shows once, with its sum)."""
    start, end, rows, path = row[:4]
    spans = []
    at = start
    for stage, ns in zip(V1_STAGES, row[5:], strict=True):
        if ns >= 0:
            spans.append((stage, at, at + ns))
            at += ns
    return FlatRecord("v1", transport, model, version, start, end, rows, spans, PATHS[path])
