"""A ``/v1`` request's session: its counters updated and its items read in the session store,
behind the feature reads' circuit breaker, so a store that is down or slow degrades the request
(a reason in its ``degraded_reasons``) instead of failing it; and a session's new item events
stored."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson

from redline.serving.deadline import Budget
from redline.serving.predict.breaker import CircuitBreaker
from redline.serving.predict.features import FeatureRead
from redline.serving.predict.request import PredictRequest
from redline.serving.predict.session_events import SessionEventWriter
from redline.serving.predict.sessions import (
    RedisSessionStore,
    SessionItem,
    SessionState,
    SessionStore,
)


class SessionAccess:
    """The session store as a request uses it; ``features`` lends its event-loop Redis
    connection and tells the breaker how each call ended."""

    def __init__(self, sessions: SessionStore, breaker: CircuitBreaker, features: FeatureRead,
                 events: SessionEventWriter) -> None:
        self.sessions = sessions
        self.breaker = breaker
        self.features = features
        self.events = events
        self.shared = sessions.kind == "redis"  # a store other replicas share: guarded

    def update(self, req: PredictRequest, fields: dict[str, np.ndarray], reasons: list[str]
               ) -> SessionState | None:
        """Count a request into its session and return the session's state (None: the store is
        down or its circuit open, and ``reasons`` says so)."""
        assert req.session_id is not None
        increments: dict[str, float] = {"requests": float(len(req.fields))}
        for name, col in fields.items():
            finite = col[np.isfinite(col)]
            increments[f"{name}_sum"] = float(finite.sum())
        event = orjson.dumps(req.fields[-1]) if req.fields else None
        shared = self.shared
        if shared and not self.breaker.allow():
            reasons.append("session store circuit open: session state not updated")
            return None
        try:
            state = self.sessions.update(req.session_id, increments, event)
        except Exception as exc:  # noqa: BLE001 - degrade: answer without session state
            if shared:
                self.breaker.failure()
            reasons.append(f"session store unavailable ({type(exc).__name__}): session state "
                           "not updated")
            return None
        if shared:
            self.breaker.success()
        return state

    def items(self, session_id: str, limit: int | None = None,
              reasons: list[str] | None = None) -> list[SessionItem]:
        """The session's items, most recent first (at most ``limit``), for a request's graph.

        Each :class:`SessionItem` has ``item_id``, ``type`` (``click``...) and ``ts_ms``. An unknown
        or expired session has no items (a cold start, not an error). When the shared store is
        down or its circuit is open the answer is ``[]`` and the reason is appended to
        ``reasons`` (the request's ``degraded_reasons``), so the caller answers degraded
        instead of failing. Reads only: it neither changes the session nor extends its TTL.
        """
        shared = self.shared
        if shared and not self.breaker.allow():
            _session_reason(reasons, "session store circuit open")
            return []
        try:
            items = self.sessions.items(session_id, limit)
        except Exception as exc:  # noqa: BLE001 - degrade: answer without session items
            if shared:
                self.breaker.failure()
            _session_reason(reasons, f"session store unavailable ({type(exc).__name__})")
            return []
        if shared:
            self.breaker.success()
        return items

    async def read_items(self, session_id: str, limit: int | None, budget: Budget,
                         reserve_s: float, reasons: list[str]) -> list[SessionItem]:
        """:meth:`items` for a request, bound by its budget.

        On a single Redis the read goes over the event loop's own connection (the feature
        reads' one) and is waited for no longer than the budget leaves after ``reserve_s`` (the
        steps that follow): a slow store degrades this request alone, and the late reply still
        reaches the circuit breaker. Elsewhere the read is the store's own, inline: the memory
        store's costs microseconds, Redis Cluster's is bound by ``features.redis_timeout_ms``.
        """
        client = self.features.loop_redis
        sessions = self.sessions
        if client is None or not isinstance(sessions, RedisSessionStore) or (
                limit is not None and limit <= 0):
            return self.items(session_id, limit, reasons)
        if not self.breaker.allow():
            _session_reason(reasons, "session store circuit open")
            return []
        answer: asyncio.Future[tuple[Any, BaseException | None]] = (
            asyncio.get_running_loop().create_future())

        def done(reply: Any, exc: BaseException | None) -> None:
            self.features.store_call_ended(exc)  # a late reply still tells the breaker
            if not answer.done():
                answer.set_result((reply, exc))

        client.call(sessions.items_command(session_id, limit), done)
        wait = budget.wait_for(reserve_s)
        try:
            reply, exc = await asyncio.wait_for(answer, wait)
        except TimeoutError:
            _session_reason(reasons, f"session store slow (no answer within {wait * 1e3:.1f} ms)")
            return []
        if exc is not None:
            _session_reason(reasons, f"session store unavailable ({type(exc).__name__})")
            return []
        return sessions.decode_items(reply)

    def add_events(self, session_id: str, items: list[SessionItem]) -> SessionState:
        """Store a session's new item events (oldest first) atomically and return its state:
        the next read on any replica sharing the store sees them. A store that is down is a
        :class:`~redline.errors.StoreUnavailable` (503): an event is never dropped silently.
        With ``pipeline.session_catalogue`` set, an unknown item id is an ``InvalidInput``."""
        return self.events.add(session_id, items)


def _session_reason(reasons: list[str] | None, why: str) -> None:
    """A request answered without its session's items says why (``degraded_reasons``)."""
    if reasons is not None:
        reasons.append(f"{why}: session items not read")
