"""Has the online store lost its data? The share of missing entities against its baseline.

A Redis that restarts without persistence (or is flushed) answers every read, quickly and
without error, with nothing: every ``/v1`` answer then says ``entity_missing: true`` and is
served on the declared defaults, and neither the breaker nor the health check sees anything
wrong. What does change is the share of rows whose entity is missing: it jumps from its usual
level (new cards, unknown users) to nearly all.

So each ``/v1`` row read from a reachable store is counted (found or missing) on the request
path, two integer additions; once a second :meth:`EntityLossDetector.update` compares the
missing share of the last ``window_s`` with a baseline: a moving average (half-life
``baseline_half_life_s``) of the seconds that have left the window, so a jump is measured
against what came before it. The store is taken to have lost its data when the recent share
is at least ``jump`` above the baseline over at least ``min_rows`` rows; the baseline stays
put meanwhile, and the condition clears by itself once the share is back within half of
``jump`` of it (ingest refilled the store). Each change is one WARNING line; the state is in
the pipeline's stats, the ``/v2/health/ready`` body and ``redline_online_store_entities_lost``.
"""

from __future__ import annotations

import logging
import time
from collections import deque

log = logging.getLogger("redline.serving")


class EntityLossDetector:
    """Counts found and missing entities; :meth:`update` (once a second) decides."""

    def __init__(self, window_s: float = 10.0, min_rows: int = 50, jump: float = 0.3,
                 baseline_half_life_s: float = 600.0, url: str = "") -> None:
        self.window_s = window_s
        self.min_rows = min_rows
        self.jump = jump
        self.half_life_s = baseline_half_life_s
        self.url = url
        self.rows = 0  # cumulative, added to on the request path
        self.missing = 0
        self.lost = False
        self.since: float | None = None  # wall time of the last change
        self.baseline: float | None = None  # missing share before the recent window
        self.recent: float | None = None  # missing share over the recent window
        self._baseline_rows = 0
        self._seen = (0, 0)  # rows, missing at the last update
        self._baseline_t: float | None = None
        self._window: deque[tuple[float, int, int]] = deque()  # (time, rows, missing)

    def count(self, rows: int, missing: int) -> None:
        """Rows answered from a reachable store, and how many of their entities it lacked."""
        self.rows += rows
        self.missing += missing

    def update(self, now: float | None = None) -> bool:
        """Fold the counts since the last call in; returns whether the store has lost data."""
        now = time.monotonic() if now is None else now
        rows, missing = self.rows, self.missing
        d_rows, d_missing = rows - self._seen[0], missing - self._seen[1]
        self._seen = (rows, missing)
        window = self._window
        if d_rows:
            window.append((now, d_rows, d_missing))
        while window and window[0][0] <= now - self.window_s:
            self._into_baseline(*window.popleft())
        recent_rows = sum(r for _, r, _ in window)
        if recent_rows < self.min_rows:
            self.recent = None
            return self.lost
        self.recent = sum(m for _, _, m in window) / recent_rows
        base = self.baseline
        if base is None or self._baseline_rows < self.min_rows:
            return self.lost
        if not self.lost and self.recent - base >= self.jump:
            self._change(True, base)
        elif self.lost and self.recent - base < self.jump / 2:
            self._change(False, base)
        return self.lost

    def _into_baseline(self, t: float, rows: int, missing: int) -> None:
        if self.lost:
            return  # the baseline is what came before the loss, until it clears
        share = missing / rows
        if self.baseline is None:
            self.baseline = share
        else:
            last = self._baseline_t if self._baseline_t is not None else t
            weight = 1.0 - 0.5 ** (max(t - last, 1.0) / self.half_life_s)
            self.baseline += weight * (share - self.baseline)
        self._baseline_t = t
        self._baseline_rows += rows

    def _change(self, lost: bool, base: float) -> None:
        self.lost, self.since = lost, time.time()
        recent = self.recent or 0.0
        if lost:
            log.warning("online store %s: %.0f%% of /v1 entities missing over the last %.0f s, "
                        "%.0f%% before: it seems to have lost its data (restarted empty or "
                        "flushed); answers use feature defaults until ingest refills it",
                        self.url, 100 * recent, self.window_s, 100 * base)
        else:
            log.warning("online store %s: entities found again (%.0f%% missing, %.0f%% before "
                        "the loss)", self.url, 100 * recent, 100 * base)

    def as_dict(self) -> dict[str, object]:
        return {"found": self.rows - self.missing, "missing": self.missing, "lost": self.lost,
                "recent_missing_share": None if self.recent is None else round(self.recent, 4),
                "baseline_missing_share": None if self.baseline is None
                else round(self.baseline, 4),
                "since": None if self.since is None else round(self.since, 3)}
