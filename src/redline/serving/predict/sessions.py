"""Short-lived per-session state that every replica sees: counters, last N events, last N items.

A session (a checkout, a login, a browsing visit) is identified by the client's ``session_id``.
Each request of the session adds to its counters and appends its event, and reads the result, in
one atomic step — a Lua script in Redis, a lock in the embedded store — so two replicas serving
alternate requests of one session never lose an update. Item events (``POST
/v1/sessions/{id}/events``: a click, an add-to-cart) go to the session's items, newest first,
the same way. State expires ``ttl_s`` after the session's last request or event.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from redline.errors import InvalidInput, StoreUnavailable
from redline.features.sessions import SessionItem, item_increments

MAX_SESSION_ID = 128

# KEYS: counters hash, events list, items list. ARGV: ttl ms, max events, event ('' = none),
# then counter/increment pairs. One script = one atomic read-modify-write = one round trip.
UPDATE_SCRIPT = r"""
local ttl = tonumber(ARGV[1])
local maxn = tonumber(ARGV[2])
for i = 4, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
if ARGV[3] ~= '' then
  redis.call('RPUSH', KEYS[2], ARGV[3])
  redis.call('LTRIM', KEYS[2], -maxn, -1)
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return {redis.call('HGETALL', KEYS[1]), redis.call('LRANGE', KEYS[2], 0, -1)}
"""

# KEYS: counters hash, events list, items list. ARGV: ttl ms, max items, number of counter
# pairs k, the k pairs, then the encoded items oldest first (LPUSH leaves the newest at the
# head). Returns the counters and the number of items kept.
ITEMS_SCRIPT = r"""
local ttl = tonumber(ARGV[1])
local maxn = tonumber(ARGV[2])
local k = tonumber(ARGV[3])
for i = 4, 3 + 2 * k, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
for i = 4 + 2 * k, #ARGV do
  redis.call('LPUSH', KEYS[3], ARGV[i])
end
redis.call('LTRIM', KEYS[3], 0, maxn - 1)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return {redis.call('HGETALL', KEYS[1]), redis.call('LLEN', KEYS[3])}
"""


@dataclass
class SessionState:
    """A session after this request's update: counter values and its last events (oldest first)."""

    session_id: str
    counters: dict[str, float] = field(default_factory=dict)
    events: list[bytes] = field(default_factory=list)
    items: int = 0  # how many items the session keeps (read them with ``items()``)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.session_id, "counters": self.counters, "events": len(self.events),
                "items": self.items}


def check_session_id(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_SESSION_ID:
        shown = repr(value)
        if len(shown) > 60:
            shown = f"{shown[:40]}... ({len(value) if isinstance(value, str) else '?'} chars)"
        raise InvalidInput(
            f"session_id must be a non-empty string of at most {MAX_SESSION_ID} characters, "
            f"got {shown}"
        )
    return value


class SessionStore(Protocol):
    kind: str

    def update(self, session_id: str, increments: Mapping[str, float],
               event: bytes | None = None) -> SessionState: ...

    def get(self, session_id: str) -> SessionState: ...

    def add_items(self, session_id: str, items: list[SessionItem]) -> SessionState: ...

    def items(self, session_id: str, limit: int | None = None,
              patient: bool = False) -> list[SessionItem]: ...

    def close(self) -> None:
        """Release what the store opened itself (at shutdown)."""
        ...


class _Entry:
    __slots__ = ("counters", "events", "expires", "items")

    def __init__(self, max_events: int, max_items: int) -> None:
        self.expires = 0.0
        self.counters: dict[str, float] = {}
        self.events: deque[bytes] = deque(maxlen=max_events)
        self.items: deque[SessionItem] = deque(maxlen=max_items)  # newest first


class MemorySessionStore:
    """The embedded store: one process, a lock per update."""

    kind = "memory"

    def __init__(self, ttl_s: float = 1800.0, max_events: int = 20,
                 max_items: int = 50) -> None:
        self.ttl_s = ttl_s
        self.max_events = max_events
        self.max_items = max_items
        self._lock = threading.Lock()
        self._data: dict[str, _Entry] = {}
        self._next_sweep = 0.0

    def _entry(self, session_id: str, now: float) -> _Entry:
        """The live entry (a new one if none or expired), its TTL restarted; under the lock."""
        if now >= self._next_sweep:
            self._sweep(now)
        entry = self._data.get(session_id)
        if entry is None or entry.expires < now:
            entry = self._data[session_id] = _Entry(self.max_events, self.max_items)
        entry.expires = now + self.ttl_s
        return entry

    def update(self, session_id: str, increments: Mapping[str, float],
               event: bytes | None = None) -> SessionState:
        now = time.monotonic()
        with self._lock:
            entry = self._entry(session_id, now)
            counters = entry.counters
            for name, inc in increments.items():
                counters[name] = counters.get(name, 0.0) + float(inc)
            if event is not None:
                entry.events.append(event)
            return SessionState(session_id, dict(counters), list(entry.events),
                                len(entry.items))

    def get(self, session_id: str) -> SessionState:
        return self.update(session_id, {}, None) if session_id in self._data else \
            SessionState(session_id)

    def add_items(self, session_id: str, items: list[SessionItem]) -> SessionState:
        now = time.monotonic()
        with self._lock:
            entry = self._entry(session_id, now)
            counters = entry.counters
            for name, inc in item_increments(items).items():
                counters[name] = counters.get(name, 0.0) + inc
            entry.items.extendleft(items)
            return SessionState(session_id, dict(counters), list(entry.events),
                                len(entry.items))

    def items(self, session_id: str, limit: int | None = None,
              patient: bool = False) -> list[SessionItem]:
        with self._lock:
            entry = self._data.get(session_id)
            if entry is None or entry.expires < time.monotonic():
                return []
            kept = list(entry.items)
        return kept if limit is None else kept[:limit]

    def close(self) -> None:
        """Nothing to release: the sessions live in this process."""

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + 60.0
        for key in [k for k, v in self._data.items() if v.expires < now]:
            del self._data[key]


class RedisSessionStore:
    """Sessions in Redis, shared by every replica; keys share a hash tag (cluster-safe).

    ``client`` serves the request path (its timeout fits a budget); ``patient_client``, when
    given, stores item events and serves ``items(patient=True)``, where a slow store should
    be waited for rather than refused.
    """

    kind = "redis"

    def __init__(self, client: Any, url: str = "", ttl_s: float = 1800.0,
                 max_events: int = 20, max_items: int = 50,
                 patient_client: Any = None) -> None:
        self.client = client
        self.patient_client = patient_client if patient_client is not None else client
        self.url = url
        self.ttl_ms = int(ttl_s * 1000)
        self.max_events = max_events
        self.max_items = max_items
        self.script = client.register_script(UPDATE_SCRIPT)
        self.items_script = self.patient_client.register_script(ITEMS_SCRIPT)

    def close(self) -> None:
        """Close the patient client when it is one of its own (``client`` is the online
        store's, which closes it)."""
        if self.patient_client is not self.client:
            self.patient_client.close()

    @staticmethod
    def keys(session_id: str) -> list[str]:
        """The session's keys, one hash tag so that a cluster keeps them on one node (an id
        with a brace would bend the tag: such ids are tagged by their digest instead)."""
        tag = session_id
        if "{" in tag or "}" in tag:
            tag = "#" + hashlib.sha1(tag.encode()).hexdigest()
        return [f"rl:sess:{{{tag}}}:c", f"rl:sess:{{{tag}}}:e", f"rl:sess:{{{tag}}}:i"]

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(f"session store at {self.url or 'Redis'} is unavailable "
                                f"({type(exc).__name__}: {exc})")

    def update(self, session_id: str, increments: Mapping[str, float],
               event: bytes | None = None) -> SessionState:
        args: list[Any] = [self.ttl_ms, self.max_events, event or b""]
        for name, inc in increments.items():
            args.append(name)
            args.append(repr(float(inc)))
        try:
            counters_raw, events = self.script(keys=self.keys(session_id), args=args)
        except Exception as exc:  # noqa: BLE001 - any client failure means "unavailable"
            raise self._unavailable(exc) from exc
        return SessionState(session_id, _counters(counters_raw), list(events))

    def get(self, session_id: str) -> SessionState:
        return self.update(session_id, {}, None)

    def add_items(self, session_id: str, items: list[SessionItem]) -> SessionState:
        increments = item_increments(items)
        args: list[Any] = [self.ttl_ms, self.max_items, len(increments)]
        for name, inc in increments.items():
            args += [name, repr(inc)]
        args += [item.encode() for item in items]
        try:
            counters_raw, kept = self.items_script(keys=self.keys(session_id), args=args)
        except Exception as exc:  # noqa: BLE001 - any client failure means "unavailable"
            raise self._unavailable(exc) from exc
        return SessionState(session_id, _counters(counters_raw), [], int(kept))

    def items(self, session_id: str, limit: int | None = None,
              patient: bool = False) -> list[SessionItem]:
        if limit is not None and limit <= 0:
            return []
        client = self.patient_client if patient else self.client
        try:
            raw = client.execute_command(*self.items_command(session_id, limit))
        except Exception as exc:  # noqa: BLE001 - any client failure means "unavailable"
            raise self._unavailable(exc) from exc
        return self.decode_items(raw)

    def items_command(self, session_id: str, limit: int | None) -> list[Any]:
        """The read :meth:`items` sends (``limit`` > 0 or None), for a caller with its own
        connection (a request's budget-bound read on the event loop)."""
        return ["LRANGE", self.keys(session_id)[2], 0, -1 if limit is None else limit - 1]

    @staticmethod
    def decode_items(raw: list[bytes]) -> list[SessionItem]:
        return [SessionItem.decode(r) for r in raw]


def _counters(raw: list[bytes]) -> dict[str, float]:
    return {raw[i].decode(): float(raw[i + 1]) for i in range(0, len(raw), 2)}
