"""Item events posted to a session (``POST /v1/sessions/{id}/events``): checked, then stored.

A body is one event or a list of them: ``{"item_id": "i123", "type": "click", "ts_ms": ...}``.
Every event is checked before any is stored, so a bad one in a list stores nothing and the
answer names it; ``ts_ms`` defaults to the time the server received the event.
"""

from __future__ import annotations

import re
import time
from collections.abc import Set
from pathlib import Path
from typing import Any

from redline.errors import ConfigError, InvalidInput, PayloadTooLarge
from redline.serving.predict.sessions import SessionItem

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

            table = read_table(p)
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


def check_known(items: list[SessionItem], catalogue: Set[str] | None) -> None:
    """With a catalogue configured, every event must name an item in it."""
    if catalogue is None:
        return
    unknown = [i for i, item in enumerate(items) if item.item_id not in catalogue]
    if unknown:
        first = unknown[0]
        raise InvalidInput(f"event {first}: unknown item_id {_short(items[first].item_id)} "
                           f"({len(unknown)} of {len(items)} events name items that are not in "
                           "pipeline.session_catalogue); send ids of the catalogue")
