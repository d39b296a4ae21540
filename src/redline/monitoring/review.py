"""Human review of edge cases: uncertain, out-of-range and drifted requests, at a bounded rate.

A request is a candidate when its predicted probability is near the decision threshold, when an
input lies outside the training range, or when a drift alarm covers one of its features. A token
bucket bounds how many are queued per minute and the queue has a fixed capacity (the oldest
unlabelled item goes first), so a flood of odd traffic cannot grow memory. A reviewer's label
goes to the quality monitor (it counts as a label like any other) and into a table that exports
as Parquet for retraining.
"""

from __future__ import annotations

import io
import itertools
import threading
import time
from collections import OrderedDict
from typing import Any

from redline.errors import InvalidInput, NotFound


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
    """Items awaiting a reviewer's label, and the labelled ones (both bounded)."""

    def __init__(self, per_minute: float = 30.0, capacity: int = 1000) -> None:
        self.bucket = TokenBucket(per_minute)
        self.capacity = capacity
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._labelled: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self.offered = 0
        self.rate_limited = 0
        self.dropped = 0
        self._lock = threading.Lock()

    def offer(self, model: str, version: str, request_id: str, reasons: list[str],
              features: dict[str, Any], prediction: Any, score: float | None) -> bool:
        """Queue one candidate if the rate allows; True when queued."""
        with self._lock:
            self.offered += 1
            if not self.bucket.take():
                self.rate_limited += 1
                return False
            item_id = f"r{next(self._ids)}"
            self._items[item_id] = {
                "id": item_id, "model": model, "version": version, "request_id": request_id,
                "reasons": reasons, "features": features, "prediction": prediction,
                "score": score, "queued_at": round(time.time(), 3),
            }
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
                self.dropped += 1
            return True

    def pending(self, model: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        with self._lock:
            items = [i for i in self._items.values() if model is None or i["model"] == model]
        return items[:limit]

    def waiting(self, item_id: str, label: Any) -> dict[str, Any]:
        """The waiting item ``item_id`` (still queued), once ``label`` is known to be valid."""
        _check_label(label)
        with self._lock:
            item = self._items.get(item_id)
        if item is None:
            raise _not_waiting(item_id)
        return item

    def label(self, item_id: str, label: Any, reviewer: str | None = None) -> dict[str, Any]:
        """Record a reviewer's label; the item leaves the queue and joins the labelled table."""
        _check_label(label)
        with self._lock:
            item = self._items.pop(item_id, None)
            if item is None:
                raise _not_waiting(item_id)
            done = {**item, "label": float(label), "reviewer": reviewer or "",
                    "labelled_at": round(time.time(), 3)}
            self._labelled.append(done)
            if len(self._labelled) > self.capacity * 10:
                del self._labelled[: len(self._labelled) - self.capacity * 10]
        return done

    def labelled(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._labelled)

    def stats(self) -> dict[str, int]:
        return {"waiting": len(self._items), "labelled": len(self._labelled),
                "offered": self.offered, "rate_limited": self.rate_limited,
                "dropped": self.dropped, "capacity": self.capacity}

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
