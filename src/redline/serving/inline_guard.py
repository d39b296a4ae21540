"""A user's Python run on the event loop, stopped if it runs long.

Why run it on the loop at all: a Python model that does little costs a request a few
microseconds there, and a hop to a worker thread and back costs about a hundred (two handoffs of
the GIL and the thread wake-ups; measured against the ONNX path at concurrency 8). Why it is
safe: before each run an interval timer is armed (``setitimer``, one system call each way); if the
run is still going when it fires, the ``SIGALRM`` handler raises :class:`RanTooLong` inside it,
which interrupts Python code and blocking calls alike (a sleep, a lock, a socket read). The
batcher then runs the batch again on a worker thread, where the requests' budgets apply, and
keeps the model off the loop for a while; a hung ``predict`` therefore holds the loop for at most
``limit_s``. The timer counts wall time, so a busy machine that preempts a short run can stop it
too: the first pause off the loop is short, and only stops that follow each other lengthen it
(doubling up to ``max_cooldown_s``), so a model that hangs again and again costs the loop one
``limit_s`` a minute at most, and one stopped by chance is back on the loop in half a second.

Python delivers signals to the main thread only, so the guard works only where the event loop
runs on the main thread (``redline serve``) and no one else uses ``SIGALRM``; elsewhere
:meth:`InlineGuard.allows` says no and every run goes to a worker thread.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from redline.serving.deadline import now

log = logging.getLogger("redline.serving")
T = TypeVar("T")
LIMIT_S = 0.005  # inline runs are predicted under inline_max_us (120 µs); 5 ms is far beyond
COOLDOWN_S = 0.5  # after a run was stopped, the model's runs stay off the loop this long...
MAX_COOLDOWN_S = 60.0  # ...doubled for each stop soon after the last pause, up to this

_active = False  # a guarded run is under way (on the main thread)
_installed: bool | None = None  # whether our SIGALRM handler is in place; None: not tried


class RanTooLong(BaseException):
    """Raised inside a guarded run when its time is up. A ``BaseException``, so that a model's
    own ``except Exception`` does not swallow it."""


def _on_alarm(signum: int, frame: Any) -> None:
    if _active:
        raise RanTooLong()


def _install() -> bool:
    """Put the SIGALRM handler in place, once; False off the main thread or where another
    handler is already set (then this guard leaves the signal alone)."""
    global _installed
    if _installed is not None:
        return _installed
    if threading.current_thread() is not threading.main_thread() or not hasattr(
            signal, "setitimer"):
        return False  # not cached: another server in this process may run on the main thread
    current = signal.getsignal(signal.SIGALRM)
    if current in (signal.SIG_DFL, None, _on_alarm):
        signal.signal(signal.SIGALRM, _on_alarm)
        _installed = True
    else:
        _installed = False
    return _installed


class InlineGuard:
    """Per model version: whether a run may happen on the loop now, and the guarded run."""

    def __init__(self, name: str, limit_s: float = LIMIT_S, cooldown_s: float = COOLDOWN_S,
                 max_cooldown_s: float = MAX_COOLDOWN_S) -> None:
        self.name = name
        self.limit_s = limit_s
        self.base_cooldown_s = self.cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.stopped = 0  # runs stopped at the limit
        self._usable: bool | None = None
        self._off_until = 0.0
        self._warned = -math.inf

    def allows(self) -> bool:
        """Whether the next run may happen on the loop (called on the loop's thread)."""
        if self._usable is None:
            self._usable = _install()
        return self._usable and now() >= self._off_until

    def run(self, fn: Callable[[Any], T], arg: Any) -> T:
        """``fn(arg)``, or :class:`RanTooLong` once ``limit_s`` has passed."""
        global _active
        _active = True
        signal.setitimer(signal.ITIMER_REAL, self.limit_s)
        try:
            return fn(arg)
        finally:
            _active = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    def tripped(self) -> None:
        """A run was stopped: keep the model's runs off the loop for ``cooldown_s``, twice as
        long as last time when the last pause ended moments ago."""
        t = now()
        self.stopped += 1
        if self.stopped > 1 and t - self._off_until < self.cooldown_s:
            self.cooldown_s = min(self.max_cooldown_s, 2 * self.cooldown_s)
        else:
            self.cooldown_s = self.base_cooldown_s
        self._off_until = t + self.cooldown_s
        if t - self._warned >= 60.0:
            self._warned = t
            log.warning("model '%s': a run on the event loop took longer than %.0f ms and was "
                        "stopped (%d so far); it runs again on a worker thread, and the model's "
                        "runs stay off the loop for %.1f s", self.name, self.limit_s * 1e3,
                        self.stopped, self.cooldown_s)
