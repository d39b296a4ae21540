"""The tick's worker thread hands the GIL to the event loop between small units of work.

The monitoring tick runs its window work (``ModelWindows.absorb``, the drift and quality
reports) on a worker thread so the loop keeps serving. But that thread holds the GIL while it
runs Python, and CPython takes the GIL from it only after the switch interval (5 ms): a
request that arrived meanwhile waited up to that long in its queue stage, once a second.
``time.sleep(0)`` does not help: the releasing thread
usually takes the GIL straight back before the waiting one runs.

So the work is cut into units of a few hundred microseconds (a version's slice of records, one
feature of a drift report, one version's quality report), and between two units the thread
calls ``yield_to_loop()``: it schedules a callback on the loop and blocks until the loop has
run it. That is a deterministic hand-over: the loop gets the GIL, serves whatever was ready,
and only then does the thread go on. Outside the tick (a route calling ``report()`` from its
own thread, a test, the shutdown) ``yield_to_loop()`` does nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

MAX_WAIT_S = 0.1  # a loop busy for longer than this: go on rather than wait for it


class LoopHandoff:
    """Blocks the calling (worker) thread until ``loop`` has run one callback."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.loop_thread = threading.get_ident()
        self.handoffs = 0
        self.gave_up = False  # the loop did not answer within MAX_WAIT_S: stop waiting for it
        self._event = threading.Event()

    def __call__(self) -> None:
        if self.gave_up or threading.get_ident() == self.loop_thread:
            return  # on the loop itself: nothing to hand over to
        event = self._event
        event.clear()
        try:
            self.loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop is closed: nobody waits for the GIL
            return
        if not event.wait(MAX_WAIT_S):
            self.gave_up = True  # e.g. the loop blocks on this thread's lock (shutdown)
        self.handoffs += 1


_handoff: contextvars.ContextVar[LoopHandoff | None] = contextvars.ContextVar(
    "redline_loop_handoff", default=None)


def yield_to_loop() -> bool:
    """Between two units of the tick's thread work: let the event loop run first. False
    when not on the tick's thread (nothing was handed over)."""
    handoff = _handoff.get()
    if handoff is None:
        return False
    handoff()
    return True


async def to_thread_yielding(func: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread(func, *args)`` whose ``yield_to_loop()`` calls hand the GIL to
    this loop (the worker thread runs in a copy of this context)."""
    token = _handoff.set(LoopHandoff(asyncio.get_running_loop()))
    try:
        return await asyncio.to_thread(func, *args)
    finally:
        _handoff.reset(token)
