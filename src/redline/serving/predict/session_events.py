"""Item events of a session: checked, then stored, by one writer (:class:`SessionEventWriter`).

They arrive posted to a session (``POST /v1/sessions/{id}/events``) or through ingest (events of
source ``session`` on the event stream, in ``POST /v1/events`` or a replayed file). A posted body
is one event or a list of them: ``{"item_id": "i123", "type": "click", "ts_ms": ...}``. Every
event of a post is checked before any is stored, so a bad one in a list stores nothing and the
answer names it; ingest dead-letters a bad event and stores the others. ``ts_ms`` defaults to the
time the event arrived.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Any

from redline.errors import ConfigError, InvalidInput, PayloadTooLarge
from redline.features.sessions import SessionEvent
from redline.serving.predict.sessions import (
    SessionItem,
    SessionState,
    SessionStore,
    check_session_id,
)

MAX_EVENTS_PER_REQUEST = 1000
MAX_ITEM_ID = 256
EVENT_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
FIELDS = ("item_id", "type", "ts_ms")
EXAMPLE = '{"item_id": "i123", "type": "click", "ts_ms": 1764468000000}'


def parse_session_events(doc: Any, now_ms: int | None = None) -> list[SessionItem]:
    """The events of one request body, oldest first, or :class:`InvalidInput` saying which
    event is wrong and how."""
    events = doc if isinstance(doc, list) else [doc]
    if not events:
        raise InvalidInput(f"no events: send one event or a list of them, e.g. {EXAMPLE}")
    if len(events) > MAX_EVENTS_PER_REQUEST:
        raise PayloadTooLarge(f"{len(events)} events in one request; send at most "
                              f"{MAX_EVENTS_PER_REQUEST} per request")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return [_event(e, i, now) for i, e in enumerate(events)]


def _event(ev: Any, index: int, now_ms: int) -> SessionItem:
    where = f"event {index}"
    if not isinstance(ev, dict):
        raise InvalidInput(f"{where} must be a JSON object like {EXAMPLE}, "
                           f"got {type(ev).__name__}")
    unknown = sorted(set(ev) - set(FIELDS))
    if unknown:
        raise InvalidInput(f"{where} has unknown fields {unknown}; an event has "
                           f"{', '.join(FIELDS)} (ts_ms optional)")
    item_id = ev.get("item_id")
    if not isinstance(item_id, str) or not item_id or len(item_id) > MAX_ITEM_ID:
        raise InvalidInput(f"{where}: item_id must be a non-empty string of at most "
                           f"{MAX_ITEM_ID} characters, got {_short(item_id)}")
    kind = ev.get("type")
    if not isinstance(kind, str) or not EVENT_TYPE.fullmatch(kind):
        raise InvalidInput(f"{where}: type must be a word of letters, digits and _ (at most "
                           f"32, starting with a letter) such as click or add_to_cart, got "
                           f"{_short(kind)}")
    ts = ev.get("ts_ms", now_ms)
    if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts < 2**53:
        raise InvalidInput(f"{where}: ts_ms must be a non-negative integer of epoch "
                           f"milliseconds, got {_short(ts)}")
    return SessionItem(item_id, kind, ts)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_catalogue(path: str) -> frozenset[str]:
    """The item ids of ``pipeline.session_catalogue``: a text file of one id a line, or a
    ``.csv``/``.parquet`` table with an ``item_id`` column."""
    p = Path(path)
    try:
        if p.suffix in (".csv", ".parquet"):
            from redline.features.offline import read_table

            table = read_table(p, text_columns=["item_id"])  # item 007 is not item 7
            if "item_id" not in table.columns:
                raise ConfigError(f"pipeline.session_catalogue {path} has no item_id column "
                                  f"(columns: {list(table.columns)[:10]})")
            ids = frozenset(str(x) for x in table["item_id"].tolist())
        else:
            ids = frozenset(line.strip() for line in p.read_text().splitlines()
                            if line.strip())
    except OSError as exc:
        raise ConfigError(f"pipeline.session_catalogue {path} cannot be read ({exc}); point it "
                          "at a file of item ids or leave it unset") from exc
    if not ids:
        raise ConfigError(f"pipeline.session_catalogue {path} holds no item ids")
    return ids


def check_known(items: list[SessionItem], catalogue: Set[str] | None, start: int = 0) -> None:
    """With a catalogue configured, every event must name an item in it (``start``: the index
    the first of ``items`` has in what the client sent)."""
    if catalogue is None:
        return
    unknown = [i for i, item in enumerate(items) if item.item_id not in catalogue]
    if unknown:
        first = unknown[0]
        raise InvalidInput(f"event {start + first}: unknown item_id "
                           f"{_short(items[first].item_id)} "
                           f"({len(unknown)} of {len(items)} events name items that are not in "
                           "pipeline.session_catalogue); send ids of the catalogue")


class SessionEventWriter:
    """The one writer of session item events: posted ones and ingested ones are checked the same
    way and stored by the same atomic step (``SessionStore.add_items``), so the next read on any
    replica sharing the store sees them."""

    def __init__(self, sessions: SessionStore, catalogue: Set[str] | None = None) -> None:
        self.sessions = sessions
        self.catalogue = catalogue

    def add(self, session_id: str, items: list[SessionItem]) -> SessionState:
        """Store a session's new item events (oldest first) and return its state; an unknown
        item id (with a catalogue) is an ``InvalidInput``, a store that is down a
        ``StoreUnavailable``."""
        check_known(items, self.catalogue)
        return self.sessions.add_items(session_id, items)

    def add_stream_events(self, events: Sequence[SessionEvent]) -> list[tuple[int, str]]:
        """Ingest's hand-off (``features.sessions.SessionSink``): each event checked as a posted
        one (plus its ``session_id``), the good ones stored per session in arrival order;
        returns the (tag, reason) of each refused."""
        refused: list[tuple[int, str]] = []
        by_session: dict[str, list[SessionItem]] = {}
        for ev in events:
            fields = _as_sent(ev.event) if ev.flat else dict(ev.event)
            fields.pop("source", None)
            try:
                session_id = check_session_id(fields.pop("session_id", None))
                item = _event(fields, ev.tag, ev.arrival_ms)
                check_known([item], self.catalogue, ev.tag)
            except InvalidInput as exc:
                refused.append((ev.tag, f"session: {exc.message}"))
                continue
            by_session.setdefault(session_id, []).append(item)
        for session_id, items in by_session.items():
            self.sessions.add_items(session_id, items)  # each item was checked above
        return refused


def _as_sent(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A flat event's values (a Redis Stream entry's bytes) as JSON would carry them."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        if key == "ts_ms" and isinstance(value, str) and value.isdigit():
            value = int(value)
        out[key] = value
    return out
