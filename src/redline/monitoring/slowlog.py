"""The slowest requests of the last minute with their stage timings, for ``redline top`` and
the dashboard."""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from redline.monitoring.stage_times import FlatRecord
    from redline.serving.stages import RequestRecord


class SlowLog:
    """The N slowest requests of the last minute, with their stage timings.

    Six ten-second slots, each holding at most N records; a record costs one comparison unless
    it is slower than its slot's fastest kept record.
    """

    def __init__(self, size: int = 20, window_s: float = 60.0, slots: int = 6) -> None:
        self.size = max(1, size)
        self.window_s = window_s
        self.slot_s = window_s / slots
        self._slots: deque[tuple[int, list[tuple[int, int, RequestRecord | FlatRecord]]]] = deque(
            maxlen=slots + 1)
        self._floor = 0  # the fastest kept duration of the current slot once it is full
        self._seq = 0  # ties in duration keep arrival order (records do not compare)

    def request_finished(self, record: RequestRecord) -> None:
        self.fold((record,))

    def _current(self) -> list[tuple[int, int, RequestRecord | FlatRecord]]:
        """The slot of now (a new one, with no floor, when time has moved on), its records."""
        slot = int(time.monotonic() / self.slot_s)
        if not self._slots or self._slots[-1][0] != slot:
            self._slots.append((slot, []))
            self._floor = 0
        return self._slots[-1][1]

    def fold(self, records: Iterable[RequestRecord | FlatRecord]) -> None:
        kept = self._current()
        floor, seq = self._floor, self._seq
        for record in records:
            d = (record.end_ns or record.start_ns) - record.start_ns
            if d > floor:
                seq += 1
                kept.append((d, -seq, record))
                if len(kept) > 2 * self.size:
                    kept[:] = heapq.nlargest(self.size, kept, key=_first_two)
                    floor = kept[-1][0]
        if len(kept) > self.size:
            kept[:] = heapq.nlargest(self.size, kept, key=_first_two)
            floor = kept[-1][0]
        self._floor, self._seq = floor, seq

    def fold_times(self, times: np.ndarray, totals: np.ndarray,
                   make_record: Callable[[list[int]], Any]) -> None:
        """Flat stage times (``RequestMetrics.fold_times``'s rows, ``totals`` their requests'
        ns): only the requests slower than the current slot's fastest kept one become records
        (``make_record(row)``), at most ``size`` of them."""
        self._current()  # the floor below is the slot of now's
        over = np.flatnonzero(totals > self._floor)
        if over.size > self.size:
            over = over[np.argpartition(totals[over], -self.size)[-self.size:]]
        if over.size:
            self.fold([make_record(times[i].tolist()) for i in sorted(over.tolist())])

    def slowest(self) -> list[dict[str, Any]]:
        oldest = int((time.monotonic() - self.window_s) / self.slot_s)
        items = [item for slot, kept in self._slots if slot > oldest for item in kept]
        items = heapq.nlargest(self.size, items, key=_first_two)
        return [describe(r) for _, _, r in items]



def _first_two(item: tuple[int, int, Any]) -> tuple[int, int]:
    return item[0], item[1]


def describe(record: RequestRecord | FlatRecord) -> dict[str, Any]:
    """A record as JSON: who, when, how long, and each stage's microseconds."""
    return {
        "api": record.api, "transport": record.transport, "model": record.model,
        "version": record.version, "path": record.path, "status": record.status,
        "request_id": record.request_id, "rows": record.rows,
        "time": round(record.wall_ns / 1e9, 3), "total_us": round(record.total_us, 1),
        "stages_us": {k: v for k, v in record.timings_us().items() if k != "total"},
        "traceparent": record.traceparent,
    }
