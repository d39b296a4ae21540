"""Short-lived per-session state that every replica sees: counters and the last N events.

A session (a checkout, a login, a browsing visit) is identified by the client's ``session_id``.
Each request of the session adds to its counters and appends its event, and reads the result, in
one atomic step — a Lua script in Redis, a lock in the embedded store — so two replicas serving
alternate requests of one session never lose an update. State expires ``ttl_s`` after the
session's last request.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from redline.errors import InvalidInput, StoreUnavailable

MAX_SESSION_ID = 128

# KEYS: counters hash, events list. ARGV: ttl ms, max events, event ('' = none), then
# counter/increment pairs. One script = one atomic read-modify-write = one round trip.
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
return {redis.call('HGETALL', KEYS[1]), redis.call('LRANGE', KEYS[2], 0, -1)}
"""


@dataclass
class SessionState:
    """A session after this request's update: counter values and its last events (oldest first)."""

    session_id: str
    counters: dict[str, float] = field(default_factory=dict)
    events: list[bytes] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.session_id, "counters": self.counters, "events": len(self.events)}


def check_session_id(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_SESSION_ID:
        raise InvalidInput(
            f"session_id must be a non-empty string of at most {MAX_SESSION_ID} characters, "
            f"got {value!r}"
        )
    return value


class SessionStore(Protocol):
    kind: str

    def update(self, session_id: str, increments: Mapping[str, float],
               event: bytes | None = None) -> SessionState: ...

    def get(self, session_id: str) -> SessionState: ...


class MemorySessionStore:
    """The embedded store: one process, a lock per update."""

    kind = "memory"

    def __init__(self, ttl_s: float = 1800.0, max_events: int = 20) -> None:
        self.ttl_s = ttl_s
        self.max_events = max_events
        self._lock = threading.Lock()
        self._data: dict[str, tuple[float, dict[str, float], deque[bytes]]] = {}
        self._next_sweep = 0.0

    def update(self, session_id: str, increments: Mapping[str, float],
               event: bytes | None = None) -> SessionState:
        now = time.monotonic()
        with self._lock:
            if now >= self._next_sweep:
                self._sweep(now)
            item = self._data.get(session_id)
            if item is None or item[0] < now:
                item = (0.0, {}, deque(maxlen=self.max_events))
            _, counters, events = item
            for name, inc in increments.items():
                counters[name] = counters.get(name, 0.0) + float(inc)
            if event is not None:
                events.append(event)
            self._data[session_id] = (now + self.ttl_s, counters, events)
            return SessionState(session_id, dict(counters), list(events))

    def get(self, session_id: str) -> SessionState:
        return self.update(session_id, {}, None) if session_id in self._data else \
            SessionState(session_id)

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + 60.0
        for key in [k for k, v in self._data.items() if v[0] < now]:
            del self._data[key]


class RedisSessionStore:
    """Sessions in Redis, shared by every replica; keys share a hash tag (cluster-safe)."""

    kind = "redis"

    def __init__(self, client: Any, url: str = "", ttl_s: float = 1800.0,
                 max_events: int = 20) -> None:
        self.client = client
        self.url = url
        self.ttl_ms = int(ttl_s * 1000)
        self.max_events = max_events
        self.script = client.register_script(UPDATE_SCRIPT)

    @staticmethod
    def keys(session_id: str) -> list[str]:
        return [f"rl:sess:{{{session_id}}}:c", f"rl:sess:{{{session_id}}}:e"]

    def update(self, session_id: str, increments: Mapping[str, float],
               event: bytes | None = None) -> SessionState:
        args: list[Any] = [self.ttl_ms, self.max_events, event or b""]
        for name, inc in increments.items():
            args.append(name)
            args.append(repr(float(inc)))
        try:
            counters_raw, events = self.script(keys=self.keys(session_id), args=args)
        except Exception as exc:  # noqa: BLE001 - any client failure means "unavailable"
            raise StoreUnavailable(
                f"session store at {self.url or 'Redis'} is unavailable "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        counters = {counters_raw[i].decode(): float(counters_raw[i + 1])
                    for i in range(0, len(counters_raw), 2)}
        return SessionState(session_id, counters, list(events))

    def get(self, session_id: str) -> SessionState:
        return self.update(session_id, {}, None)
