"""A user's Python run on the event loop, stopped if it runs long.

Why run it on the loop at all: a Python model that does little costs a request a few
microseconds there, and a hop to a worker thread and back costs about a hundred (two handoffs of
the GIL and the thread wake-ups; measured against the ONNX path at concurrency 8). Why it is
safe: a run starts with an interval timer armed (``setitimer``); if the run is still going
when it fires, the ``SIGALRM`` handler raises :class:`RanTooLong` inside it, which interrupts
Python code and blocking calls alike (a sleep, a lock, a socket read). The batcher then runs the
batch again on a worker thread, where the requests' budgets apply, and keeps the model off the
loop for a while; a hung ``predict`` therefore holds the loop for at most ``limit_s``.

The timer is not disarmed after a run. A run that finds an alarm pending from an earlier one (at
most half a limit away) arms nothing; the alarm, finding a run younger than half a limit, arms
itself for the rest; an alarm with no run under way lapses (and ``atexit`` cancels the last one).
So a busy loop pays one alarm per half limit instead of two system calls a run, which were ~6%
of a Python graph's server at concurrency 8 (``benchmarks/models/python_compare.py``).

What counts is the run's own time: computing, or waiting on something (a sleep, a lock, the
GIL), but not waiting for a CPU while the kernel runs other processes. A busy machine (a
neighbour's load, a container's CPU quota) preempts a run of microseconds for milliseconds now
and then; stopping it for that sends the model's runs to threads for the cooldown, which costs
every request a hop and gives the loop nothing back. So the timer first fires at half the limit,
reads the thread's run-queue wait (Linux ``/proc/thread-self/schedstat``) and fires again
whenever the run's own time since then is short of the other half; a run is stopped once its own
time since that first look reaches ``OWN_SHARE`` of that half (a hang: at ``limit_s``), or,
whatever the reason, once it has held the loop ``MAX_HELD`` limits. Where the wait cannot be
read, wall time counts.

After a stop the model's runs stay off the loop a while: the first pause is short, and only
stops that follow each other lengthen it (doubling up to ``max_cooldown_s``), so a model that
hangs again and again costs the loop one ``limit_s`` a minute at most.

Python delivers signals to the main thread only, so the guard works only where the event loop
runs on the main thread (``redline serve``) and no one else uses ``SIGALRM``; elsewhere
:meth:`InlineGuard.allows` says no and every run goes to a worker thread.
"""

from __future__ import annotations

import atexit
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

OWN_SHARE = 0.75  # of the second half: a run that was on it this much is stopped
MAX_HELD = 20  # a run preempted this many limits in all is stopped anyway (100 ms by default)
SCHEDSTAT = "/proc/thread-self/schedstat"  # ns on a CPU, ns waiting for one, slices

_active = False  # a guarded run is under way (on the main thread)
_installed: bool | None = None  # whether our SIGALRM handler is in place; None: not tried
# The run under way: its half limit; once the timer has fired, the wall time (0.0: not yet) and
# run-queue wait at the first look (``_on_alarm``), half a limit after the run started.
_half_s = 0.0
_started = 0.0
_looked_at = 0.0
_waited_ns: int | None = None
_fires_at = math.inf  # when the pending alarm fires (inf: none pending)


class RanTooLong(BaseException):
    """Raised inside a guarded run when its time is up. A ``BaseException``, so that a model's
    own ``except Exception`` does not swallow it."""


def run_queue_wait_ns() -> int | None:
    """How long this thread has waited for a CPU while runnable, or None where the kernel does
    not say (not Linux, or scheduler statistics off)."""
    try:
        with open(SCHEDSTAT, "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _arm(seconds: float) -> None:
    global _fires_at
    _fires_at = now() + seconds
    signal.setitimer(signal.ITIMER_REAL, seconds)


def disarm() -> None:
    """Cancel a pending alarm (before handing SIGALRM to another owner)."""
    global _fires_at
    _fires_at = math.inf
    signal.setitimer(signal.ITIMER_REAL, 0)


def _on_alarm(signum: int, frame: Any) -> None:
    """Stop the run once its own time is up (see the module doc); else look again later."""
    global _fires_at, _looked_at, _waited_ns
    _fires_at = math.inf
    if not _active:
        return  # armed for a run that has ended: lapse until the next run arms it
    t = now()
    if _looked_at == 0.0:
        early = _half_s - (t - _started)
        if early > 0:  # armed for an earlier run: this one's first look is later
            _arm(early)
            return
        _looked_at, _waited_ns = t, run_queue_wait_ns()  # the first look, at half the limit
        _arm(_half_s)
        return
    waited = run_queue_wait_ns() if _waited_ns is not None else None
    held = t - _started
    if waited is not None and held < MAX_HELD * 2 * _half_s:
        own = (t - _looked_at) - (waited - _waited_ns) / 1e9  # type: ignore[operator]
        if own < OWN_SHARE * _half_s:
            # mostly preempted: look again once the rest of its half could have passed
            _arm(max(_half_s - own, _half_s / 4))
            return
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
        atexit.register(disarm)  # a pending alarm must not meet the default action at exit
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
        """``fn(arg)``, or :class:`RanTooLong` once it has had ``limit_s`` of its own time."""
        global _active, _half_s, _started, _looked_at
        _half_s, _started, _looked_at = self.limit_s / 2, now(), 0.0
        _active = True  # after _started: an alarm from here on measures this run
        if _fires_at > _started + _half_s:  # none pending, or one too late for this run
            _arm(_half_s)
        try:
            return fn(arg)
        finally:
            _active = False  # the alarm, if pending, lapses (module doc)

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
