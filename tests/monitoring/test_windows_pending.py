"""The windows' pending buffer: what it keeps of a record, its bound, its sample, its order."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from redline.config import MonitoringSettings
from redline.monitoring.review import ReviewQueue
from redline.monitoring.windows import PIECE, ModelWindows
from tests.monitoring.helpers import record
from tests.monitoring.test_review import meta


def windows(max_pending: int = 50_000, rows_per_s: float = 0.0) -> ModelWindows:
    settings = MonitoringSettings(window_rows_per_s=rows_per_s)
    review = ReviewQueue(0.0, 10)
    return ModelWindows(lambda m, v: meta(), settings, review, max_pending=max_pending)


def io(i: int) -> dict[str, dict[str, np.ndarray]]:
    x = np.array([[float(i), 0.5]], np.float32)
    p = np.array([[0.9, 0.1]], np.float32)
    return {"inputs": {"x": x}, "outputs": {"probabilities": p}}


def test_pending_keeps_the_arrays_not_the_records_and_nothing_the_collector_walks() -> None:
    w = windows()
    records = [record(request_id=f"r{i}", **io(i)) for i in range(3 * PIECE + 5)]
    refs = [weakref.ref(r) for r in records]
    w.fold(records[:PIECE])  # one fold as the feed does it (FOLD_EVERY records)
    w.fold(records[PIECE:])
    del records
    # The records themselves are let go of at the fold (they die on the loop, a few at a time,
    # instead of surviving to the tick and being walked by every young collection meanwhile).
    assert all(ref() is None for ref in refs)
    pieces = list(w._pending)
    assert len(pieces) == 4  # full pieces of PIECE records, then the rest
    for piece in pieces:
        assert not any(gc.is_tracked(item) for item in piece)
    assert w.absorb() == 3 * PIECE + 5
    drift = w.drift[("m", "1")]
    assert drift.report()["window"]["rows"] == 3 * PIECE + 5


def test_only_what_the_model_itself_answered_is_kept() -> None:
    w = windows()
    w.fold([record(request_id="a", **io(1)),
            record(request_id="b", path="fallback", **io(2)),
            record(request_id="c", status="timeout", **io(3)),
            record(request_id="d")])  # no arrays kept for it
    assert w.absorb() == 1


def test_the_buffer_is_bounded_and_drops_the_oldest() -> None:
    w = windows(max_pending=2 * PIECE)
    for start in range(0, 5 * PIECE, PIECE):
        w.fold([record(request_id=f"r{i}", **io(i)) for i in range(start, start + PIECE)])
    kept = [w._pending[k][2] for k in range(len(w._pending))]  # each piece's first request id
    assert kept == [f"r{3 * PIECE}", f"r{4 * PIECE}"]
    assert w.absorb() == 2 * PIECE


def test_over_the_rate_requests_with_an_id_are_all_kept_and_the_rest_sampled() -> None:
    w = windows(rows_per_s=1.0)  # the floor of 100 rows a tick applies
    with_id = [record(request_id=f"r{i}", **io(i)) for i in range(60)]
    without = [record(**io(i)) for i in range(200)]
    w.fold(with_id + without)
    assert w.absorb() == 260
    assert w.sampled_out == 200 - (100 - 60)
    assert w.drift[("m", "1")].report()["window"]["rows"] == 100
    quality = w.quality[("m", "1")]
    assert all(quality.label(f"r{i}", 1.0) for i in range(60))  # every one can still be joined
