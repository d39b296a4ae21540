"""Session item events, online and offline: one definition of what a session holds.

Serving keeps a session's last N item events (newest first) and counts them (``items``,
``items_<type>``); :func:`build_session_features` gives a training set the same values for the
same events at the same time, from an event log. Both use :class:`SessionItem` and
:func:`item_increments`, so the two cannot count differently.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from redline.errors import InvalidInput

if TYPE_CHECKING:  # pandas only for the offline builder: serving imports this module too
    import pandas as pd

EVENT_COLUMNS = ("session_id", "item_id", "type", "ts_ms")
# An event of this source is a session item event (unless the definitions declare a source of
# that name): {"source": "session", "session_id": "s1", "item_id": "i1", "type": "click"}
SESSION_SOURCE = "session"


@dataclass(frozen=True)
class SessionItem:
    """One item event of a session: which item, what happened to it, and when (epoch ms)."""

    item_id: str
    type: str
    ts_ms: int

    def encode(self) -> bytes:
        return orjson.dumps([self.item_id, self.type, self.ts_ms])

    @staticmethod
    def decode(raw: bytes) -> SessionItem:
        item_id, kind, ts_ms = orjson.loads(raw)
        return SessionItem(item_id, kind, int(ts_ms))

    def to_dict(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "type": self.type, "ts_ms": self.ts_ms}


@dataclass
class SessionEvent:
    """A session item event as an event stream delivered it, not checked yet: the event (its
    ``source`` field included, and what a dead letter keeps), whether its values arrived as
    strings (a Redis Stream entry's), when it arrived, and its place in the batch (``tag``)."""

    event: Mapping[str, Any]
    flat: bool
    arrival_ms: int
    tag: int


class SessionSink(Protocol):
    """Where ingest hands session item events: serving's session store, through the checks of
    ``POST /v1/sessions/{id}/events`` (``serving.predict.session_events.SessionEventWriter``)."""

    def add_stream_events(self, events: Sequence[SessionEvent]) -> list[tuple[int, str]]:
        """Check and store ``events`` (oldest first); returns the (tag, reason) of each refused.
        A store that is down raises ``StoreUnavailable``: nothing is acknowledged."""
        ...


def item_increments(items: Iterable[SessionItem]) -> dict[str, float]:
    """The counters item events add: ``items`` and ``items_<type>`` (model features read them
    as ``session:items``, ``session:items_click``)."""
    out: dict[str, float] = {}
    for item in items:
        out["items"] = out.get("items", 0.0) + 1.0
        key = f"items_{item.type}"
        out[key] = out.get(key, 0.0) + 1.0
    return out



def build_session_features(events: pd.DataFrame, labels: pd.DataFrame, *,
                           max_items: int = 50, ttl_s: float = 1800.0,
                           time_column: str = "ts_ms") -> pd.DataFrame:
    """``labels`` (``session_id`` and ``time_column`` in epoch ms) plus the session features a
    request at that time sees online: ``session:items`` and ``session:items_<type>`` (one per
    type in ``events``; 0 when none) and ``session_items``, the last ``max_items`` item ids,
    newest first.

    ``events`` has ``session_id``, ``item_id``, ``type``, ``ts_ms``, in the order they were
    posted (the stores keep that order: newest first means last posted first). An event counts
    for a label at the same or a later time (it was posted before the request). As online, a
    session whose last event is more than ``ttl_s`` old is gone: the next event starts it
    afresh. (Online, predict requests of the session also keep it
    alive; the log holds item events only.)
    """
    absent = [c for c in EVENT_COLUMNS if c not in events.columns]
    if absent:
        raise InvalidInput(f"session events lack column(s) {absent}; they need "
                           f"{', '.join(EVENT_COLUMNS)}")
    for col in ("session_id", time_column):
        if col not in labels.columns:
            raise InvalidInput(f"labels lack column '{col}'")
    ttl_ms = ttl_s * 1000.0
    ordered = events.reset_index(drop=True)  # the posting order is the stores' order
    by_session: dict[str, list[SessionItem]] = {}
    for sid, item_id, kind, ts in zip(ordered["session_id"], ordered["item_id"],
                                      ordered["type"], ordered["ts_ms"], strict=True):
        by_session.setdefault(str(sid), []).append(SessionItem(str(item_id), str(kind), int(ts)))
    types = sorted({str(k) for k in events["type"]})
    rows: list[dict[str, Any]] = []
    for sid, t in zip(labels["session_id"], labels[time_column], strict=True):
        rows.append(_state_at(by_session.get(str(sid), []), int(t), max_items, ttl_ms, types))
    import pandas as pd

    out = labels.reset_index(drop=True).copy()
    feats = pd.DataFrame(rows, index=out.index)
    for col in feats.columns:
        out[col] = feats[col]
    return out


def _state_at(items: list[SessionItem], t: int, max_items: int, ttl_ms: float,
              types: list[str]) -> dict[str, Any]:
    """Replay one session's events up to time ``t`` the way the stores apply them."""
    kept: deque[SessionItem] = deque(maxlen=max_items)
    counters: dict[str, float] = {}
    last = None
    for item in items:
        if item.ts_ms > t:
            continue  # posted after the request at ``t``
        if last is not None and item.ts_ms - last > ttl_ms:
            kept.clear()
            counters = {}
        for name, inc in item_increments([item]).items():
            counters[name] = counters.get(name, 0.0) + inc
        kept.appendleft(item)
        last = item.ts_ms
    if last is not None and t - last > ttl_ms:
        kept.clear()
        counters = {}
    row: dict[str, Any] = {"session:items": counters.get("items", 0.0)}
    for kind in types:
        row[f"session:items_{kind}"] = counters.get(f"items_{kind}", 0.0)
    row["session_items"] = [i.item_id for i in kept]
    return row
