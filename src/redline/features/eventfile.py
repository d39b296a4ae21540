"""Event files read as ingest would receive them (JSONL, CSV, Parquet), and when each event
arrived.

Kept apart from the offline builder so that replaying a JSON-lines file into a server's store at
start-up (``features.preload``) imports no pandas: a server needs it nowhere else, and its import
is a tenth of the demo's replay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redline.errors import InvalidInput
from redline.features.event_values import MAX_TS_MS, MIN_TS_MS, to_ms
from redline.features.events import EventDecoder

ARRIVAL = "_arrival_ms"


def existing_file(path: str | Path) -> Path:
    """``path`` as a Path; an InvalidInput naming it when nothing is there."""
    p = Path(path)
    if not p.exists():
        raise InvalidInput(f"file {p} does not exist")
    return p


@dataclass
class EventLog:
    """Raw events as ingest would receive them; ``flat``: every value is text (CSV rows)."""

    raws: list[Any]
    flat: bool = False


def read_events(path: str | Path) -> EventLog:
    """An event file as raw events: JSON lines stay bytes (parsed by the decoder, as over HTTP),
    CSV rows are text maps (decoded like Redis Stream fields, empty cells are absent), Parquet
    rows are typed values."""
    p = existing_file(path)
    suffix = p.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson", ".json"):
            return EventLog([ln for ln in p.read_bytes().splitlines() if ln.strip()])
        if suffix == ".csv":
            import pandas as pd

            return text_log(pd.read_csv(p, dtype=str, keep_default_na=False))
        if suffix in (".parquet", ".pq"):
            import pandas as pd

            from redline.features.frames import frame_events  # pandas, only for Parquet

            return EventLog(frame_events(pd.read_parquet(p)))
    except (ValueError, OSError) as exc:
        raise InvalidInput(f"cannot read {p}: {exc}") from exc
    raise InvalidInput(f"{p}: unknown event file format '{suffix}' (use .jsonl, .csv or .parquet)")


def text_log(frame: Any) -> EventLog:
    """CSV rows read as text (``dtype=str``) as the flat events ingest takes: every cell text,
    an empty or missing cell an absent field, as in a Redis Stream entry."""
    return EventLog([{str(k): v for k, v in r.items() if isinstance(v, str) and v != ""}
                     for r in frame.to_dict("records")], flat=True)


def arrival_of(obj: Any, decoder: EventDecoder, arrival_column: str = ARRIVAL) -> int:
    """When an event from a file arrived: its ``arrival_column``, else its event time, else 0."""
    if type(obj) is dict or isinstance(obj, Mapping):  # a dict decided without the ABC's check
        if arrival_column in obj:
            ms = to_ms(obj[arrival_column])
            if ms is not None:
                return ms
        src = obj.get("source", decoder.default_source)
        plan = decoder.plans.get(src) if isinstance(src, str) else None
        if plan is not None:
            ts = obj.get(plan.source.timestamp)
            if type(ts) is int and MIN_TS_MS <= ts <= MAX_TS_MS:
                return ts  # the common case, as ``to_ms`` would answer it
            ms = to_ms(ts)
            if ms is not None:
                return ms
    return 0
