"""What an event's values mean, the same on every path (ingest, HTTP push, file replay, the
offline builder): its time in epoch milliseconds, its entity and event ids as text, a field's
value of its schema type, and the stable id that breaks ``last`` ties."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
MIN_TS_MS = -62_135_596_800_000  # 0001-01-01: the range ISO-8601 and datetime share
MAX_TS_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999
# A number with a fraction or an exponent, as JSON writes one (a leading "+" or "." allowed)
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def to_ms(value: Any) -> int | None:
    """Event time in epoch milliseconds, the same way on every path and under any pandas: an
    integer, an integral-or-not float (floored), a numeric string (read as the same number would
    be in JSON: an integer exactly, else as a float, floored), an ISO-8601 string (no zone: UTC),
    or a ``datetime`` (pandas ``Timestamp`` included); ``None`` when it is none of those or
    outside years 1-9999.

    >>> to_ms(1700000000123), to_ms("1700000000123"), to_ms("2023-11-14T22:13:20.123Z")
    (1700000000123, 1700000000123, 1700000000123)
    >>> to_ms(1790000000000.75), to_ms("1790000000000.75"), to_ms("1.79e12")
    (1790000000000, 1790000000000, 1790000000000)
    """
    ms: int | None = None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        ms = value
    elif isinstance(value, float):
        ms = math.floor(value) if math.isfinite(value) else None
    elif isinstance(value, datetime):
        ms = _datetime_ms(value)
    elif isinstance(value, str | bytes):
        text = (value.decode(errors="replace") if isinstance(value, bytes) else value).strip()
        try:
            ms = int(text)
        except ValueError:
            if _DECIMAL.fullmatch(text):  # a fraction or an exponent: the float JSON would give
                return to_ms(float(text))
            try:
                dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                return None
            ms = _datetime_ms(dt)
    elif hasattr(value, "item"):  # a numpy scalar
        return to_ms(value.item())
    if ms is None or not MIN_TS_MS <= ms <= MAX_TS_MS:
        return None
    return ms


def _datetime_ms(dt: datetime) -> int:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // _MS


def coerce(value: Any, typ: str, flat: bool) -> Any:
    """Value of a schema type, or ``None`` when it is not one (strings only from flat maps)."""
    if hasattr(value, "item") and not isinstance(value, str | bytes | float | int):
        value = value.item()  # a numpy scalar (events from a DataFrame)
    if flat and isinstance(value, bytes | str):
        text = value.decode() if isinstance(value, bytes) else value
        try:
            if typ == "int":
                return int(text)
            if typ == "float":
                x = float(text)
                return x if math.isfinite(x) else None
            if typ == "bool":
                return {"true": True, "false": False, "1": True, "0": False}.get(text.lower())
        except ValueError:
            return None
        return text
    if typ == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            x = float(value)
            return x if math.isfinite(x) else None
        return None
    if typ == "int":  # an integral float (2.0) is an int, as in the offline builder's columns
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if typ == "bool":
        return value if isinstance(value, bool) else None
    return value if isinstance(value, str) else None


def entity_id_of(value: Any) -> str | None:
    """An event's entity id as text (a string, or an integer: ``42`` is entity ``"42"``); ``None``
    when it is anything else (a float, a bool, empty)."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if value is not None and hasattr(value, "item") and not isinstance(value, str):
        value = value.item()  # a numpy scalar (events from a DataFrame)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        return None
    return value


def event_id_of(value: Any) -> str | None:
    """An event's id as text (a non-empty string or an integer); ``None`` when it is not one."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        return None
    return str(value)


_BLAKE2B_8 = hashlib.blake2b(digest_size=8)


def stable_id(parts: Sequence[bytes]) -> int:
    """A 53-bit id of an event (exact as a double, so Lua and Python compare it alike): the last
    tie-breaker of ``last``, after event time and arrival."""
    h = _BLAKE2B_8.copy()  # cheaper than a new hash object, which parses its options
    h.update(b"\x1f".join(parts))
    return int.from_bytes(h.digest(), "little") >> 11
