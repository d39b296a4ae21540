"""Is the online store reachable? Logged at start and on every change, shown in the health body.

Beside it, once a second, whether a reachable store seems to have lost its data
(``serving/entity_loss.py``): reachable and empty is a condition of its own.

An unreachable store does not make the server unready: ``/v1`` answers degrade (near cache,
declared defaults, ``degraded: true``) instead of failing, and a Redis outage taking every replica
out of the load balancer at once would turn a degraded service into no service. Readiness stays
about what a replica can serve (its models); the store's state is reported beside it, in the
``/v2/health/ready`` body and the log, where operators and alerts see it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redline.features.online.base import OnlineStore

log = logging.getLogger("redline.serving")


class StoreHealth:
    """Pings the store off the event loop every ``interval_s``; reports only changes."""

    def __init__(self, store: OnlineStore | None, url: str = "", interval_s: float = 1.0,
                 entity_loss: Any = None) -> None:
        self.store = store
        self.entity_loss = entity_loss  # serving/entity_loss.py: reachable, but emptied?
        self.url = url
        self.interval_s = interval_s
        self.reachable: bool | None = None  # None: not checked yet
        self.error: str | None = None
        self.since = time.time()

    @property
    def remote(self) -> bool:
        return self.store is not None and self.store.kind != "memory"

    async def check(self) -> bool:
        """Ping once; log when the state differs from the last check (and at the first one)."""
        store = self.store
        if store is None or not self.remote:
            return True
        try:
            await asyncio.to_thread(store.ping)
            ok, error = True, None
        except Exception as exc:  # noqa: BLE001 - any failure to answer is "unreachable"
            ok, error = False, getattr(exc, "message", None) or str(exc) or type(exc).__name__
        if ok != self.reachable:
            first = self.reachable is None
            self.reachable, self.error, self.since = ok, error, time.time()
            if not ok:
                log.warning("online store %s unreachable: %s; /v1 answers degrade (near cache, "
                            "defaults) and the server stays ready", self.url, error)
            elif not first:
                log.warning("online store %s reachable again", self.url)
            else:
                log.info("online store %s reachable", self.url)
        else:
            self.error = error
        return ok

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check()
            if self.entity_loss is not None:
                self.entity_loss.update()

    def body(self) -> dict[str, Any]:
        """Fields added to the ``/v2/health/ready`` body."""
        if self.store is None or not self.remote or self.reachable is None:
            return {}
        store = {"kind": self.store.kind, "reachable": self.reachable,
                 "since": round(self.since, 3)}
        if not self.reachable:
            store["error"] = self.error
            return {"degraded": True, "online_store": store}
        if self.entity_loss is not None:
            store["entities_lost"] = self.entity_loss.lost
        return {"degraded": False, "online_store": store}
