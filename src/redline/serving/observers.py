"""Who hears of finished requests: the observers a server is built with (the monitor's feed,
a rollout's), and the protocols that say what each can do beyond ``request_finished``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from redline.serving.stages import RequestRecord, StageTimes


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
    observer (then those requests need no record); a graph's V2 rows carry the ns of its
    ``steps`` (their stage names) too."""

    def stage_times(self, api: str, transport: str, model: str, version: str,
                    steps: tuple[str, ...] = ()) -> StageTimes: ...


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
        self.stage_times: Callable[..., StageTimes] | None = None
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
