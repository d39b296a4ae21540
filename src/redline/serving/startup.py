"""Start-up phases, each logged at INFO with its time as it ends, so a slow start says where.

``redline serve`` logs, in order: the imports and settings (since the process started), the
server's construction, the preload of the memory store (with its rate), the model loads, the
store check, the request-path warm-up, the listeners, then one line with the whole time.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("redline.serving")


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``), or None where unknown."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class StartupPhases:
    """The time of each phase since the previous one ended; ``ready`` sums them up."""

    def __init__(self) -> None:
        now = time.monotonic()
        age = process_age_s()
        self._start = now - age if age is not None and age >= 0 else now
        self._last = self._start
        self.phases: list[tuple[str, float]] = []
        self._pending: list[str] = []

    def done(self, phase: str, detail: str = "", quiet_until_next: bool = False) -> float:
        """Log ``phase`` as finished now; returns its seconds. ``quiet_until_next``: logged
        with the next phase, so a start that fails at once (a port in use) stays one line."""
        now = time.monotonic()
        seconds = now - self._last
        self._last = now
        self.phases.append((phase, seconds))
        self._pending.append(f"start-up: {phase} in {seconds:.2f} s"
                             + (f" ({detail})" if detail else ""))
        if not quiet_until_next:
            for line in self._pending:
                log.info("%s", line)
            self._pending.clear()
        return seconds

    def ready(self) -> float:
        """Log the whole start (process start to listening), the preload apart."""
        total = time.monotonic() - self._start
        preload = sum(s for name, s in self.phases if name == "preload")
        log.info("start-up: ready in %.2f s since the process started (%.2f s without the "
                 "preload)", total, total - preload)
        return total
