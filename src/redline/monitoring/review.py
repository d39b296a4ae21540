"""Human review of edge cases: uncertain, out-of-range and drifted requests, at a bounded rate.

A request is a candidate when its predicted probability is near the decision threshold, when an
input lies outside the training range, or when a drift alarm covers one of its features. A token
bucket bounds how many are queued per minute and the queue has a fixed capacity (the oldest
unlabelled item goes first), so a flood of odd traffic cannot grow memory. With several
workers or replicas the queue lives beside the shared label join (``reviewstore.py``). A
reviewer's label goes to the quality monitor (it counts as a label like any other) and into a
table that exports as Parquet for retraining.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

from redline.errors import InvalidInput, NotFound, StoreUnavailable
from redline.monitoring.reviewstore import MemoryReviewStore, ReviewStore


class TokenBucket:
    """At most ``per_minute`` events a minute, with bursts up to ``burst``."""

    def __init__(self, per_minute: float, burst: float | None = None) -> None:
        self.rate = per_minute / 60.0
        self.burst = burst if burst is not None else max(1.0, per_minute / 6.0)
        self.tokens = self.burst
        self.last = time.monotonic()

    def peek(self) -> bool:
        """Whether a token is available now (without taking it)."""
        now = time.monotonic()
        return min(self.burst, self.tokens + (now - self.last) * self.rate) >= 1.0

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class ReviewQueue:
    """Items awaiting a reviewer's label, and the labelled ones (both bounded), kept in a
    ``ReviewStore``: this process's memory, or beside a shared label join (``reviewstore.py``)
    so every worker and replica queues into one list. The rate is per process."""

    def __init__(self, per_minute: float = 30.0, capacity: int = 1000,
                 store: ReviewStore | None = None) -> None:
        self.bucket = TokenBucket(per_minute)
        self.capacity = capacity
        self.store: ReviewStore = store if store is not None else MemoryReviewStore(capacity)
        self.offered = 0
        self.rate_limited = 0
        self.unavailable = 0  # candidates not queued because a shared store was down
        self._counts: dict[str, int] = {"waiting": 0, "labelled": 0, "dropped": 0}
        self._lock = threading.Lock()

    def offer(self, model: str, version: str, request_id: str, reasons: list[str],
              features: dict[str, Any], prediction: Any, score: float | None) -> bool:
        """Queue one candidate if the rate allows; True when queued."""
        with self._lock:
            self.offered += 1
            if not self.bucket.take():
                self.rate_limited += 1
                return False
        try:
            self.store.add({
                "model": model, "version": version, "request_id": request_id,
                "reasons": reasons, "features": features, "prediction": prediction,
                "score": score, "queued_at": round(time.time(), 3)})
        except StoreUnavailable:
            self.unavailable += 1
            return False
        return True

    def pending(self, model: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        items = [i for i in self.store.items() if model is None or i["model"] == model]
        return items[:limit]

    def waiting(self, item_id: str, label: Any) -> dict[str, Any]:
        """The waiting item ``item_id`` (still queued), once ``label`` is known to be valid."""
        _check_label(label)
        item = self.store.get(item_id)
        if item is None:
            raise _not_waiting(item_id)
        return item

    def label(self, item_id: str, label: Any, reviewer: str | None = None) -> dict[str, Any]:
        """Record a reviewer's label; the item leaves the queue and joins the labelled table."""
        _check_label(label)
        item = self.store.pop(item_id)  # atomic: one process takes it
        if item is None:
            raise _not_waiting(item_id)
        done = {**item, "label": float(label), "reviewer": reviewer or "",
                "labelled_at": round(time.time(), 3)}
        self.store.add_labelled(done)
        return done

    def labelled(self) -> list[dict[str, Any]]:
        return self.store.labelled()

    @property
    def dropped(self) -> int:
        return self.stats()["dropped"]

    def refresh(self) -> dict[str, int]:
        """The store's counts now (a shared store: I/O, so off the event loop)."""
        try:
            self._counts = self.store.counts()
        except StoreUnavailable:
            pass  # the last counts stand
        return self._counts

    def stats(self, fresh: bool = True) -> dict[str, int]:
        """Counts; ``fresh=False`` gives the last refreshed ones (no I/O: the summary route)."""
        counts = self.refresh() if fresh else self._counts
        return {**counts, "offered": self.offered, "rate_limited": self.rate_limited,
                "unavailable": self.unavailable, "capacity": self.capacity}

    def export_parquet(self) -> bytes:
        """The labelled table as Parquet: one column per feature, then prediction and label."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:  # pragma: no cover - pyarrow ships with the [offline] extra
            raise InvalidInput("exporting the review table needs pyarrow: "
                               "pip install 'redline[offline]'") from None
        rows = self.labelled()
        names = sorted({k for r in rows for k in r["features"]})
        columns: dict[str, list[Any]] = {
            "review_id": [r["id"] for r in rows], "model": [r["model"] for r in rows],
            "version": [r["version"] for r in rows], "request_id": [r["request_id"] for r in rows],
            "reasons": [",".join(r["reasons"]) for r in rows],
        }
        for name in names:
            columns[name] = [_float(r["features"].get(name)) for r in rows]
        columns["score"] = [r["score"] for r in rows]
        columns["label"] = [r["label"] for r in rows]
        columns["reviewer"] = [r["reviewer"] for r in rows]
        columns["labelled_at"] = [r["labelled_at"] for r in rows]
        buf = io.BytesIO()
        pq.write_table(pa.table(columns), buf)
        return buf.getvalue()


def _float(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _check_label(label: Any) -> None:
    if label is None or isinstance(label, bool) or not isinstance(label, int | float):
        raise InvalidInput(f"a review label must be a number (the class or the target), "
                           f"got {label!r}")


def _not_waiting(item_id: str) -> NotFound:
    return NotFound(f"no review item '{item_id}' is waiting (it may have been labelled already "
                    "or dropped from a full queue)")
