"""How an edge ends a request, in one call: :class:`RequestEnd` hands the finished record to the
observers, or for a common request only its flat stage times (:class:`FlatTimes`, ``/v1``);
:class:`V2End` does it for V2 from the clock reads the edge took, making a record only when
something needs one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from redline.serving.observers import Observers
from redline.serving.stages import (
    DECODE,
    ENCODE,
    INFERENCE,
    RequestRecord,
    StageTimes,
    graph_times,
    perf_ns,
)


class FlatSeries:
    """The lone observer's ``StageTimes`` of each (model, version) for one API and transport,
    asked for once.

    ``series((model, version))`` is None while no lone observer keeps stage times (a rollout
    observes too): then every request needs its record. ``draw(times, duration)`` is None when
    the request leaves its row, else the head sample's draw for the record it gets instead."""

    __slots__ = ("_observers", "_api", "_transport", "_series")

    def __init__(self, observers: Observers, api: str, transport: str) -> None:
        self._observers = observers
        self._api, self._transport = api, transport
        self._series: dict[tuple[str, str], StageTimes] = {}

    def series(self, key: tuple[str, str], steps: tuple[str, ...] = ()) -> StageTimes | None:
        """The series of ``key``: (model, version), as ``ModelHandle.key`` holds it (a graph's
        with its ``steps``' stages, ``ModelHandle.step_stages``)."""
        make = self._observers.stage_times  # None while a rollout observes requests too
        if make is None:
            return None
        times = self._series.get(key)
        if times is None:
            times = self._series[key] = make(self._api, self._transport, *key, steps)
        return times

    @staticmethod
    def draw(times: StageTimes, duration_ns: int) -> bool | None:
        countdown = times.countdown - 1
        if countdown and duration_ns <= times.slow_ns:
            times.countdown = countdown
            return None
        # The head sample was drawn here (tracing keeps a slow one whatever the draw).
        times.countdown = countdown or times.gap()
        return not countdown


class FlatTimes(FlatSeries):
    """Where one API and transport's finished records leave their stage times instead of
    themselves: the row a record leaves in its series (``v1_times``).

    ``keep(record)`` is asked for a finished, ok request: True when its row went into its
    series' buffer and the record can be dropped; False when something needs the record -- a
    request id (a label may join it), a caller ``traceparent``, the trace head sample (drawn
    here: ``record.trace_keep``), slowness, stages its row has no column for (a general graph's
    steps on ``/v1``) -- or no lone observer keeps stage times. A request
    in the windows' sample leaves its arrays beside its row (``samples``), not its record, which
    the records' fold would walk through the metrics, the slow log and the windows."""

    __slots__ = ("_row",)

    def __init__(self, observers: Observers, api: str, transport: str,
                 row: Callable[[RequestRecord], list[int] | None]) -> None:
        super().__init__(observers, api, transport)
        self._row = row

    def keep(self, record: RequestRecord) -> bool:
        if record.request_id or record.traceparent is not None:
            return False
        times = self.series((record.model, record.version))
        if times is None:
            return False
        draw = self.draw(times, record.end_ns - record.start_ns)
        if draw is None:
            values = self._row(record)
            if values is None:  # the row cannot say it all: the record goes (tracing draws)
                return False
            if record.inputs is not None and record.path == "primary":
                times.samples += (record.inputs, record.outputs)  # the windows' sample
            row = times.times
            row += values
            if len(row) >= times.spill_at:
                times.spill()  # (why: monitoring/stage_times.py)
            return True
        record.trace_keep = draw
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
    it. A graph's request is timed on a record from its decode (its steps are stages), and a
    common one, at once or queued, answered on its primary path, leaves that record's row
    (``graph_times``) instead of the record. ``failed(...)`` ends a request with its error's
    code. Each returns the W3C ``traceparent`` the answer carries (None: none). Called only
    while someone observes."""

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
            if not (request_id or traceparent is not None or handle.shadowed):
                times = self.series(handle.key)
                if times is not None:
                    draw = self.draw(times, end_ns - start_ns)
                    if draw is None:  # a common request: its row, no record
                        if (handle.keep_io and decoded_ns >= handle.io_next_ns
                                and handle.sample_due(decoded_ns)):
                            times.samples += (inputs, outputs)  # the windows' sample
                        flat = times.times
                        flat += (start_ns, decoded_ns, inferred_ns, end_ns, rows)
                        if len(flat) >= times.spill_at:
                            times.spill()  # (why: monitoring/stage_times.py)
                        return None
            record = self.record(handle, request_id, traceparent, rows, start_ns, decoded_ns)
            record.spans.append((INFERENCE, decoded_ns, inferred_ns))
            record.trace_keep = draw  # drawn here, or left to tracing
            handle.keep_io_on(record, inputs, outputs, decoded_ns)
        elif handle.steps_on_record and record.path == "primary" and not (
                request_id or traceparent is not None or handle.shadowed):
            times = self.series(handle.key, handle.step_stages)
            if times is not None:
                draw = self.draw(times, end_ns - record.start_ns)
                if draw is None:  # a common graph request: its row, not its record
                    if record.inputs is not None:  # (the graph kept its windows' sample)
                        times.samples += (record.inputs, record.outputs)
                    flat = times.times
                    flat += graph_times(record, inferred_ns, end_ns, handle.step_columns)
                    if len(flat) >= times.spill_at:
                        times.spill()
                    return None
                record.trace_keep = draw
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
    steps_on_record: bool  # a graph: its record comes with its steps' spans
    step_stages: tuple[str, ...]  # a graph's steps' stages, in its order (else empty)
    step_columns: dict[str, int]  # each of those stages' column in a graph's row
    keep_io: bool
    io_next_ns: int

    def sample_due(self, t0: int) -> bool: ...

    def keep_io_on(self, record: RequestRecord, inputs: Any, outputs: Any, t0: int) -> None: ...


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
                 row: Callable[[RequestRecord], list[int] | None] | None = None) -> None:
        self._observers = observers
        self._flat = FlatTimes(observers, api, transport, row) if row is not None else None

    def finish(self, record: RequestRecord, status: str = "ok",
               end_ns: int | None = None) -> str | None:
        record.status = status
        record.end_ns = perf_ns() if end_ns is None else end_ns  # record.finish, inline
        observers = self._observers
        if not observers:
            return None
        flat = self._flat
        if flat is not None and status == "ok" and flat.keep(record):
            return None
        traceparent = observers.traceparent(record)  # tracing on: the request's trace
        observers.finished(record)
        return traceparent
