"""The named stages of a request and the record each request leaves behind.

Every stage of both APIs (V2 and ``/v1``, REST and gRPC) is timed once, here: the Prometheus
histograms, the trace spans, the slow-request log and ``/v1``'s ``timings_us`` all read the same
``RequestRecord`` -- or, for a common request, the same times as a few integers in a flat
``StageTimes`` list (no record kept: see that class). Observers (``monitoring``) receive
finished records; the serving code never imports them, the server wires them in.

Times are ``time.perf_counter_ns()`` values; ``wall_ns`` anchors them to the wall clock
(``time.time_ns()`` at the start) so trace spans can be exported with real timestamps after the
request has finished (tail sampling decides then whether to keep them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

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


def v1_times(record: RequestRecord) -> list[int]:
    """A finished ``/v1`` record as its flat ``StageTimes`` row (``V1_TIME_FIELDS`` integers)."""
    attrs = record.attributes
    age = attrs.get("feature_age_s") if attrs else None
    row = [record.start_ns, record.end_ns, record.rows, _PATH_INDEX[record.path],
           -1 if age is None else int(age * 1e9), *_NOT_PASSED]
    column = _V1_COLUMN
    for stage, start, end in record.spans:
        j = column.get(stage)
        if j is None:
            continue  # a graph's own steps (step:<name>): in timings_us and traces only
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
    inferred..end) and its rows; the
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
    in the sample and ``gap()`` draws the next countdown)."""

    times: list[int]
    samples: list[Any]
    slow_ns: int
    countdown: int

    def gap(self) -> int: ...


class FlatSeries:
    """The lone observer's ``StageTimes`` of each (model, version) for one API and transport,
    asked for once.

    ``series((model, version))`` is None while no lone observer keeps stage times (a rollout
    observes too): then every request needs its record. Its users take the trace head-sample
    draw inline (a call less a request): count ``countdown`` down; a request that reaches zero,
    or is slower than ``slow_ns``, gets a record instead of its row (``record.trace_keep``:
    whether it was drawn) and draws the next countdown with ``gap()``."""

    __slots__ = ("_observers", "_api", "_transport", "_series")

    def __init__(self, observers: Observers, api: str, transport: str) -> None:
        self._observers = observers
        self._api, self._transport = api, transport
        self._series: dict[tuple[str, str], StageTimes] = {}

    def series(self, key: tuple[str, str]) -> StageTimes | None:
        """The series of ``key``: (model, version), as ``ModelHandle.key`` holds it."""
        make = self._observers.stage_times  # None while a rollout observes requests too
        if make is None:
            return None
        times = self._series.get(key)
        if times is None:
            times = self._series[key] = make(self._api, self._transport, *key)
        return times


class FlatTimes(FlatSeries):
    """Where one API and transport's finished records leave their stage times instead of
    themselves: the row a record leaves in its series (``v1_times``).

    ``keep(record)`` is asked for a finished, ok request: True when its row went into its
    series' buffer and the record can be dropped; False when something needs the record -- a
    request id (a label may join it), a caller ``traceparent``, the trace head sample (drawn
    here: ``record.trace_keep``), slowness -- or no lone observer keeps stage times. A request
    in the windows' sample leaves its arrays beside its row (``samples``), not its record, which
    the records' fold would walk through the metrics, the slow log and the windows."""

    __slots__ = ("_row",)

    def __init__(self, observers: Observers, api: str, transport: str,
                 row: Callable[[RequestRecord], list[int]]) -> None:
        super().__init__(observers, api, transport)
        self._row = row

    def keep(self, record: RequestRecord) -> bool:
        if (record.request_id or record.traceparent is not None
                or self._observers.stage_times is None):
            return False
        key = (record.model, record.version)
        times = self._series.get(key)  # (``series`` and ``draw``, without their calls)
        if times is None:
            times = self.series(key)
            if times is None:
                return False
        countdown = times.countdown - 1
        if countdown and record.end_ns - record.start_ns <= times.slow_ns:
            times.countdown = countdown
            if record.inputs is not None and record.path == "primary":
                times.samples += (record.inputs, record.outputs)  # the windows' sample
            times.times += self._row(record)
            return True
        # The head sample was drawn here (tracing keeps a slow one whatever the draw).
        times.countdown = countdown or times.gap()
        record.trace_keep = not countdown
        return False


class V2End(FlatSeries):
    """How a V2 edge (REST or gRPC) ends a request, in one call, from the clock reads it took:
    ``start`` (arrival), ``decoded`` (inputs checked, about to run), ``inferred`` and ``end``.

    ``answered(...)``: a request answered at once and ok that names no request id and no
    caller ``traceparent`` leaves those reads in its version's flat :class:`StageTimes` (and,
    as the windows' sample, its arrays) unless it is drawn for the trace head sample or is slow
    (:class:`FlatSeries`); any other gets its :class:`RequestRecord`, built from the same reads
    and handed to the observers (:class:`RequestEnd`). A request that has to queue for its model
    gets its record when it queues (``record``), so the queue and inference stages are timed on
    it; ``failed(...)`` ends a request with its error's code. Each returns the W3C
    ``traceparent`` the answer carries (None: none). Called only while someone observes."""

    __slots__ = ("_end",)

    def __init__(self, observers: Observers, transport: str) -> None:
        super().__init__(observers, "v2", transport)
        self._end = RequestEnd(observers, "v2", transport)

    def record(self, handle: VersionRef, request_id: str, traceparent: str | None, rows: int,
               start_ns: int, decoded_ns: int) -> RequestRecord:
        """The record of a request decoded at ``decoded_ns``."""
        record = RequestRecord("v2", self._transport, start_ns)
        record.model, record.version = handle.key
        record.request_id = request_id
        record.traceparent = traceparent
        record.rows = rows
        record.spans.append((DECODE, start_ns, decoded_ns))  # record.add, one call less
        return record

    def answered(self, handle: VersionRef, request_id: str, traceparent: str | None, rows: int,
                 inputs: Any, outputs: Any, start_ns: int, decoded_ns: int, inferred_ns: int,
                 end_ns: int, record: RequestRecord | None = None) -> str | None:
        if record is None:  # run at once
            draw: bool | None = None
            if (self._observers.stage_times is not None
                    and not (request_id or traceparent is not None or handle.shadowed)):
                times = self._series.get(handle.key)  # (``series``, without its call)
                if times is None:
                    times = self.series(handle.key)
                if times is not None:
                    countdown = times.countdown - 1  # (``draw``, without its call)
                    if countdown and end_ns - start_ns <= times.slow_ns:
                        # a common request: its row, no record
                        times.countdown = countdown
                        if (handle.keep_io and decoded_ns >= handle.io_next_ns
                                and handle.sample_due(decoded_ns)):
                            times.samples += (inputs, outputs)  # the windows' sample
                        times.times += (start_ns, decoded_ns, inferred_ns, end_ns, rows)
                        return None
                    times.countdown = countdown or times.gap()
                    draw = not countdown  # in the head sample, or slow
            record = self.record(handle, request_id, traceparent, rows, start_ns, decoded_ns)
            record.spans.append((INFERENCE, decoded_ns, inferred_ns))
            record.trace_keep = draw  # drawn here, or left to tracing
            handle.keep_io_on(record, inputs, outputs, decoded_ns)
        record.spans.append((ENCODE, inferred_ns, end_ns))
        return self._end.finish(record, end_ns=end_ns)

    def failed(self, code: str, start_ns: int, traceparent: str | None,
               handle: VersionRef | None = None, request_id: str = "", rows: int = 0,
               decoded_ns: int = 0, record: RequestRecord | None = None) -> str | None:
        """End a failed request with its error's ``code``: on its record when it queued, else
        on one made of what was known (its version once found, its decode once done)."""
        if record is None:
            record = RequestRecord("v2", self._transport, start_ns)
            record.traceparent = traceparent
            record.request_id = request_id
            record.rows = rows
            if handle is not None:
                record.model, record.version = handle.key
            if decoded_ns:
                record.spans.append((DECODE, start_ns, decoded_ns))
        return self._end.finish(record, code)


class VersionRef(Protocol):
    """What :class:`V2End` reads of the model version a request ran on (``ModelHandle``)."""

    key: tuple[str, str]  # (model, version)
    shadowed: bool
    keep_io: bool
    io_next_ns: int

    def sample_due(self, t0: int) -> bool: ...

    def keep_io_on(self, record: RequestRecord, inputs: Any, outputs: Any, t0: int) -> None: ...


class RequestObserver(Protocol):
    """Receives every finished request. Must be cheap: it runs on the event loop."""

    def request_finished(self, record: RequestRecord) -> None: ...


@runtime_checkable
class TracingObserver(RequestObserver, Protocol):
    """An observer that also names the W3C ``traceparent`` a response carries (tracing), asked
    once the record is finished and before the response is sent (None: none)."""

    def response_traceparent(self, record: RequestRecord) -> str | None: ...


@runtime_checkable
class StageTimesObserver(RequestObserver, Protocol):
    """An observer that also keeps the flat stage times of the series' common requests of
    ``api`` ("v2" or "v1") over ``transport`` ("rest" or "grpc"), used only while it is the one
    observer (then those requests need no record)."""

    def stage_times(self, api: str, transport: str, model: str, version: str) -> StageTimes: ...


class RequestEnd:
    """How an edge (one API over one transport) says "this request finished, with these
    stages", in one call: ``traceparent = end.finish(record, status)``.

    It finishes the record (``status``: "ok" or the error's code) and, when someone observes,
    hands it over -- or, for a common request answered ok, only its stage times (``row``:
    ``v1_times`` for ``/v1``; without one every record is handed over) -- and returns the W3C
    ``traceparent`` the answer carries (None: none). Unobserved, it only finishes the record
    (``/v1`` answers carry its ``timings_us``)."""

    __slots__ = ("_observers", "_flat")

    def __init__(self, observers: Observers, api: str, transport: str,
                 row: Callable[[RequestRecord], list[int]] | None = None) -> None:
        self._observers = observers
        self._flat = FlatTimes(observers, api, transport, row) if row is not None else None

    def finish(self, record: RequestRecord, status: str = "ok",
               end_ns: int | None = None) -> str | None:
        record.status = status
        record.end_ns = _perf_ns() if end_ns is None else end_ns  # record.finish, inline
        observers = self._observers
        if not observers:
            return None
        flat = self._flat
        if flat is not None and status == "ok" and flat.keep(record):
            return None
        traceparent = observers.traceparent(record)  # tracing on: the request's trace
        observers.finished(record)
        return traceparent


class Observers:
    """The observers a server was started with; empty means nothing to do.

    ``finished(record)`` and ``traceparent(record)`` are the one observer's own methods when
    there is one (the monitor's feed: no loop and no extra call per request); so is
    ``stage_times`` when that one observer keeps them (else None: every request gets a record,
    as every observer then sees each request). ``observed`` is ``bool(observers)`` as a plain
    attribute, for the request paths (no call)."""

    __slots__ = ("_items", "_tracers", "finished", "traceparent", "stage_times", "observed")

    def __init__(self, items: list[RequestObserver] | None = None) -> None:
        self.observed = False
        self._items: tuple[RequestObserver, ...] = ()
        self._tracers: tuple[Callable[[RequestRecord], str | None], ...] = ()
        self.finished: Callable[[RequestRecord], None] = self._finished_all
        self.traceparent: Callable[[RequestRecord], str | None] = _no_traceparent
        self.stage_times: Callable[[str, str, str, str], StageTimes] | None = None
        for observer in items or ():
            self.add(observer)

    def __bool__(self) -> bool:
        return bool(self._items)

    def add(self, observer: RequestObserver | TracingObserver | StageTimesObserver) -> None:
        """Tell ``observer`` about every finished request; a :class:`TracingObserver` also
        names responses' ``traceparent``, a :class:`StageTimesObserver` (alone) keeps the
        common requests' stage times instead of their records."""
        self._items = (*self._items, observer)
        self.observed = True
        self.finished = (observer.request_finished if len(self._items) == 1
                         else self._finished_all)
        self.stage_times = (observer.stage_times if len(self._items) == 1
                            and isinstance(observer, StageTimesObserver) else None)
        if isinstance(observer, TracingObserver):
            tracer = observer.response_traceparent
            self._tracers = (*self._tracers, tracer)
            self.traceparent = tracer if len(self._tracers) == 1 else self._traceparent_all

    def remove(self, observer: RequestObserver) -> None:
        """Stop telling ``observer`` (a no-op if it is not one): the rest are wired as if
        added alone, so the monitor alone gets its flat stage times back."""
        rest = [o for o in self._items if o is not observer]
        self._items, self._tracers = (), ()
        self.observed = False
        self.finished, self.traceparent = self._finished_all, _no_traceparent
        self.stage_times = None
        for kept in rest:
            self.add(kept)

    def __contains__(self, observer: object) -> bool:
        return any(o is observer for o in self._items)

    def _finished_all(self, record: RequestRecord) -> None:
        for observer in self._items:
            observer.request_finished(record)

    def _traceparent_all(self, record: RequestRecord) -> str | None:
        """The ``traceparent`` for the response to a finished ``record`` (None: tracing off)."""
        for tracer in self._tracers:
            value = tracer(record)
            if value is not None:
                return value
        return None


def _no_traceparent(record: RequestRecord) -> str | None:
    return None
