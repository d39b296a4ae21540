"""The named stages of a request and the record each request leaves behind.

Every stage of both APIs (V2 and ``/v1``, REST and gRPC) is timed once, here: the Prometheus
histograms, the trace spans, the slow-request log and ``/v1``'s ``timings_us`` all read the same
``RequestRecord`` -- or, for a common request, the same times as a few integers in a flat
``StageTimes`` list (no record kept: see that class). Observers (``monitoring``) receive
finished records (``observers``); the serving code never imports them, the server wires them
in. How an edge ends a request, record or flat times, is ``request_end``.

Times are ``time.perf_counter_ns()`` values; ``wall_ns`` anchors them to the wall clock
(``time.time_ns()`` at the start) so trace spans can be exported with real timestamps after the
request has finished (tail sampling decides then whether to keep them).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

# The stages, in the order a request meets them. A request records only the ones it passes.
DECODE = "decode"
ADMISSION = "admission"
FEATURES = "features"
SESSIONS = "sessions"
QUEUE = "queue"
INFERENCE = "inference"
ENCODE = "encode"
# An inference graph's steps (``serving/predict/graph.py``); its ranker runs as queue/inference.
QUERY = "query"
RETRIEVE = "retrieve"
RANK = "rank"
RULES = "rules"
STAGES = (DECODE, ADMISSION, FEATURES, SESSIONS, QUERY, RETRIEVE, RANK, QUEUE, INFERENCE, RULES,
          ENCODE)

_perf_ns = time.perf_counter_ns
perf_ns = time.perf_counter_ns  # the clock every span uses (the same as ``deadline.now``)
_wall_ns = time.time_ns


class _RareFields:
    """The record's fields most requests never set, as class-level defaults: a record pays
    nothing for them until one is written (then into its lazily made ``__dict__``)."""

    entity_key: str | None = None
    # The trace and server-span ids a kept request's response named (tracing, when kept).
    trace_id: str | None = None          # 32 hex digits
    span_id: str | None = None           # 16 hex digits
    _wall: int = 0                       # the wall-clock anchor, once read (``wall_ns``)


class RequestRecord(_RareFields):
    """What one request did: which API and model, which path served it, and each stage's span.

    Built on every monitored request, so it is kept cheap: the fields a request writes or
    the monitor reads for every record are slots, set by the constructor with one clock read;
    the few that only some records use are class defaults (:class:`_RareFields`: a slot read
    is faster, a class default costs nothing until written), and the wall-clock anchor is
    computed when something reads it (trace export, slow log: off the request path) instead of
    a ``time.time_ns()`` per request."""

    __slots__ = ("api", "transport", "model", "version", "path", "status", "request_id",
                 "traceparent", "start_ns", "end_ns", "spans", "rows", "inputs", "outputs",
                 "attributes", "trace_keep")

    def __init__(self, api: str, transport: str, start_ns: int | None = None) -> None:
        self.api = api                      # "v2" | "v1"
        self.transport = transport          # "rest" | "grpc"
        self.model = self.version = self.request_id = ""
        self.path = "primary"               # primary | fallback | cache | default
        self.status = "ok"                  # "ok" or a RedlineError code
        self.traceparent: str | None = None  # W3C header as received, if any
        self.start_ns = _perf_ns() if start_ns is None else start_ns
        self.end_ns = 0
        self.spans: list[tuple[str, int, int]] = []   # (stage, start_ns, end_ns)
        self.rows = 0
        self.inputs: Any = None             # decoded model inputs (for drift), when kept
        self.outputs: Any = None            # model outputs (for drift/quality), when kept
        self.attributes: dict[str, Any] | None = None
        # Set by a tracing observer when it answers ``Observers.traceparent``: whether this
        # request's spans are kept (None: not decided yet). A request that drew its place in
        # the trace head sample already (``StageTimes.countdown``) comes with that draw here;
        # tracing then adds the tail rule (slow requests are kept whatever the draw).
        self.trace_keep: bool | None = None

    @property
    def wall_ns(self) -> int:
        """``start_ns`` on the wall clock (``time.time_ns()``), for exported spans' real times.

        Computed from the two clocks' offset when first read, within seconds of the request
        (the trace export, the slow log), so the request path does not read the wall clock;
        fixed once read."""
        wall = self._wall
        if not wall:
            wall = self._wall = self.start_ns + (_wall_ns() - _perf_ns())
        return wall

    @wall_ns.setter
    def wall_ns(self, value: int) -> None:
        self._wall = value

    def add(self, stage: str, start_ns: int, end_ns: int) -> None:
        self.spans.append((stage, start_ns, end_ns))

    def finish(self, status: str = "ok", end_ns: int | None = None) -> None:
        self.status = status
        self.end_ns = _perf_ns() if end_ns is None else end_ns

    @property
    def total_us(self) -> float:
        end = self.end_ns or _perf_ns()
        return (end - self.start_ns) / 1000.0

    def timings_us(self) -> dict[str, int]:
        """Microseconds per stage (summed if a stage ran twice) plus ``total``."""
        out: dict[str, int] = {}
        for name, start, end in self.spans:
            out[name] = out.get(name, 0) + (end - start) // 1000
        out["total"] = int(self.total_us)
        return out


NEVER = 1 << 62  # a countdown or a threshold that is never reached
TIME_FIELDS = 5  # integers a V2 request leaves in ``StageTimes.times``
# A ``/v1`` request's row: start, end, rows, path (index in PATHS), the feature age in ns (-1:
# none), then the ns spent in each of V1_STAGES (-1: the request did not pass it; a stage passed
# twice, as features is, summed: one observation a request, as in ``timings_us``).
PATHS = ("primary", "fallback", "cache", "default")
V1_STAGES = (DECODE, FEATURES, SESSIONS, ADMISSION, QUERY, RETRIEVE, RANK, QUEUE, INFERENCE,
             RULES)
V1_TIME_FIELDS = 5 + len(V1_STAGES)
_V1_COLUMN = {stage: 5 + i for i, stage in enumerate(V1_STAGES)}
_NOT_PASSED = (-1,) * len(V1_STAGES)
_PATH_INDEX = {path: i for i, path in enumerate(PATHS)}


def v1_times(record: RequestRecord) -> list[int] | None:
    """A finished ``/v1`` record as its flat ``StageTimes`` row (``V1_TIME_FIELDS`` integers);
    None for a general graph's request, whose steps (``step:<name>``) only its record carries
    to the metrics."""
    attrs = record.attributes
    age = attrs.get("feature_age_s") if attrs else None
    row = [record.start_ns, record.end_ns, record.rows, _PATH_INDEX[record.path],
           -1 if age is None else int(age * 1e9), *_NOT_PASSED]
    column = _V1_COLUMN
    for stage, start, end in record.spans:
        j = column.get(stage)
        if j is None:
            return None
        passed = row[j]
        row[j] = end - start if passed < 0 else passed + end - start
    return row


def graph_times(record: RequestRecord, inferred_ns: int, end_ns: int,
                columns: dict[str, int]) -> list[int]:
    """A graph's finished V2 record as its flat ``StageTimes`` row: the five V2 fields (its
    decode is its first span), then the ns in each step (``columns``: a step's stage to its
    column; -1: not run; a step run twice, summed)."""
    decoded = record.spans[0][2]
    row = [record.start_ns, decoded, inferred_ns, end_ns, record.rows,
           *(-1,) * len(columns)]
    for stage, start, end in record.spans:
        j = columns.get(stage)
        if j is not None:
            passed = row[j]
            row[j] = end - start if passed < 0 else passed + end - start
    return row


class StageTimes(Protocol):
    """One series' common requests as flat integers, without a record each (the monitor's).

    A V2 request (REST JSON or gRPC) answered at once, ok, with no request id or caller
    ``traceparent`` and not kept for a trace (nearly every request) leaves ``TIME_FIELDS``
    integers in ``times`` (and, when it is the monitoring windows' sample, its input and output
    arrays in ``samples``, as a ``/v1`` request does): ``start, decoded, inferred, end``
    (``perf_ns`` values: decode is start..decoded, inference decoded..inferred, encode
    inferred..end) and its rows; a graph's request, timed on a record for its steps, then
    leaves ``graph_times`` instead (those five, then the ns of each step); the
    monitor buckets them on its tick. Why: a :class:`RequestRecord`, its span tuples and their
    fold cost a large share of a one-row V2 request's server CPU, five integers in one
    ``list.extend`` a fraction of a microsecond (``benchmarks/observability/inline_cost.py``).

    A ``/v1`` request (REST or gRPC) of the same kind is timed on a record (its answer carries
    ``timings_us``), but the record is not kept: it leaves ``v1_times`` (``V1_TIME_FIELDS``
    integers) in its series' buffer instead, which the monitor folds with numpy
    (``FlatTimes`` decides which requests).

    The request path asks two things of it: ``slow_ns`` (a request slower than this is kept for
    its trace, so it gets a record) and ``countdown`` (requests left until the next one in the
    trace head sample, counted down by the request path; when it reaches zero the request is
    in the sample and ``gap()`` draws the next countdown). When ``times`` reaches ``spill_at``
    integers it calls ``spill()``, which packs them (why: ``monitoring/stage_times.py``)."""

    times: list[int]
    spill_at: int
    samples: list[Any]
    slow_ns: int
    countdown: int

    def gap(self) -> int: ...

    def spill(self) -> None: ...
