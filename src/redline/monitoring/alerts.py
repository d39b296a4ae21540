"""Alerts for those who run no Prometheus: a webhook called when an objective is breached.

Each tick the monitor hands the set of conditions that hold now (drift on a model version,
quality below validation, the latency objective missed) to :class:`AlertWebhook`. A condition
that starts firing is posted at once; while it keeps firing it is posted again only after a
back-off that doubles from ``min_interval_s`` to ``max_interval_s``, so a long incident sends a
handful of calls, not one per tick; when it clears, one ``resolved`` call is sent. Posts go out on
a background thread with a short timeout: a slow or dead receiver never delays a request.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from redline.monitoring.outage_log import OutageLog

log = logging.getLogger("redline.monitoring")


@dataclass
class _Firing:
    since: float
    last_sent: float
    interval: float
    sent: int
    detail: dict[str, Any]


class AlertWebhook:
    """Posts ``{"alert", "status": "firing"|"resolved", ...}`` JSON to ``url`` with back-off."""

    def __init__(self, url: str, min_interval_s: float = 60.0, max_interval_s: float = 3600.0,
                 timeout_s: float = 2.0, clock: Any = time.monotonic) -> None:
        self.url = url
        self.min_interval_s = min_interval_s
        self.max_interval_s = max(min_interval_s, max_interval_s)
        self.timeout_s = timeout_s
        self._clock = clock
        self._firing: dict[str, _Firing] = {}
        self._outbox: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1000)
        self.sent = 0
        self.failed = 0
        self.suppressed = 0
        self._outage = OutageLog(log, "alert webhook", url, every_s=min_interval_s)
        self._thread = threading.Thread(target=self._run, name="redline-alerts", daemon=True)
        self._thread.start()

    def update(self, conditions: dict[str, dict[str, Any]]) -> None:
        """``conditions``: alert key -> details, for every condition that holds now."""
        now = self._clock()
        for key, detail in conditions.items():
            state = self._firing.get(key)
            if state is None:
                self._firing[key] = _Firing(now, now, self.min_interval_s, 1, detail)
                self._post(key, "firing", detail, now, now)
            elif now - state.last_sent >= state.interval:
                state.last_sent = now
                state.sent += 1
                state.interval = min(self.max_interval_s, state.interval * 2)
                state.detail = detail
                self._post(key, "firing", detail, state.since, now)
            else:
                self.suppressed += 1
        for key in [k for k in self._firing if k not in conditions]:
            state = self._firing.pop(key)
            self._post(key, "resolved", state.detail, state.since, now)

    def firing(self) -> list[str]:
        return sorted(self._firing)

    def _post(self, key: str, status: str, detail: dict[str, Any], since: float,
              now: float) -> None:
        body = {"alert": key, "status": status, "since_s": round(now - since, 3),
                "time": round(time.time(), 3), **detail}
        try:
            self._outbox.put_nowait(body)
        except queue.Full:
            self.failed += 1

    def _run(self) -> None:
        while True:
            body = self._outbox.get()
            if body is None:
                return
            data = json.dumps(body).encode()
            request = urllib.request.Request(self.url, data=data, method="POST",
                                             headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    response.read()
                self.sent += 1
            except Exception as exc:  # noqa: BLE001 - the receiver's trouble is logged, never raised
                self.failed += 1
                self._outage.failed(exc, f"for {body['alert']}")

    def close(self) -> None:
        self._outbox.put(None)
        self._thread.join(5)

    def stats(self) -> dict[str, Any]:
        return {"url": self.url, "firing": self.firing(), "sent": self.sent,
                "failed": self.failed, "suppressed": self.suppressed}
