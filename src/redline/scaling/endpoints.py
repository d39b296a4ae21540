"""Which replica a client sends to: the fastest healthy one, with failed ones re-probed later.

Each endpoint keeps an exponentially weighted latency and a health state. A connection failure
marks it down for a short, doubling quarantine; after that one request may probe it again, so a
recovered replica comes back without anyone restarting the client. An estimate that steers the
choice ages: the ranking also sends every ``explore_every``-th request to another healthy replica,
so a replica that got faster is noticed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Endpoint:
    address: str
    ewma_ms: float = 0.0
    samples: int = 0
    down_until: float = 0.0
    quarantine_s: float = 0.0
    failures: int = 0

    def healthy(self, now: float) -> bool:
        return now >= self.down_until

    def record_ok(self, ms: float) -> None:
        self.ewma_ms = ms if self.samples == 0 else 0.8 * self.ewma_ms + 0.2 * ms
        self.samples += 1
        self.quarantine_s = 0.0

    def record_failure(self, now: float, base_s: float, max_s: float) -> None:
        self.failures += 1
        self.quarantine_s = min(max_s, self.quarantine_s * 2 if self.quarantine_s else base_s)
        self.down_until = now + self.quarantine_s


@dataclass
class EndpointSet:
    """The replicas of one service (e.g. two zones), ranked for each request."""

    endpoints: list[Endpoint]
    quarantine_s: float = 0.5
    max_quarantine_s: float = 8.0
    explore_every: int = 64
    _picks: int = field(default=0, repr=False)

    @classmethod
    def of(cls, addresses: list[str]) -> EndpointSet:
        if not addresses:
            raise ValueError("a client needs at least one endpoint")
        return cls([Endpoint(a) for a in addresses])

    def ranked(self, now: float | None = None) -> list[Endpoint]:
        """Healthy endpoints fastest first (unmeasured ones first of all), then the rest."""
        now = time.monotonic() if now is None else now
        self._picks += 1
        healthy = [e for e in self.endpoints if e.healthy(now)]
        down = sorted((e for e in self.endpoints if not e.healthy(now)),
                      key=lambda e: e.down_until)
        healthy.sort(key=lambda e: (e.samples > 0, e.ewma_ms))
        if len(healthy) > 1 and self._picks % self.explore_every == 0:
            healthy.append(healthy.pop(0))  # age the estimate: try another one this time
        return healthy + down

    def failed(self, endpoint: Endpoint, now: float | None = None) -> None:
        endpoint.record_failure(time.monotonic() if now is None else now, self.quarantine_s,
                                self.max_quarantine_s)
