"""One WARNING line per outage, not one traceback per failed send.

A receiver or collector that is down fails every send; logging each with its traceback would
bury the log. :class:`OutageLog` writes at most one line per ``every_s`` seconds, naming the
address and the reason, and says how many failures the quiet interval held.
"""

from __future__ import annotations

import logging
import time

from redline.errors import describe


class OutageLog:
    """Rate-limited WARNING lines for a failing remote endpoint (thread-safe enough: a lost
    count under a race only shortens the "and N more" figure)."""

    def __init__(self, logger: logging.Logger, what: str, address: str,
                 every_s: float = 60.0) -> None:
        self.logger = logger
        self.what = what
        self.address = address
        self.every_s = every_s
        self._next = 0.0
        self._quiet = 0

    def failed(self, exc: BaseException, detail: str = "") -> None:
        """Log ``exc`` as one line unless a line went out less than ``every_s`` ago."""
        now = time.monotonic()
        if now < self._next:
            self._quiet += 1
            return
        self._next = now + self.every_s
        more = f" ({self._quiet} more failures since the last line)" if self._quiet else ""
        self._quiet = 0
        reason = describe(exc)
        self.logger.warning("%s %s failed%s: %s%s; next line about this in %.0f s at most",
                            self.what, self.address, f" {detail}" if detail else "", reason,
                            more, self.every_s)
