"""Sleep until an exact time without spinning: a Linux ``timerfd`` watched by the event loop.

The open-loop generator must send each request at its scheduled time, but the event loop's own
timers have 1 ms resolution (uvloop rounds to the millisecond), so the generator used to sleep
most of the gap and spin through the rest (``LoadSpec.spin_s``). The spin holds a core: at
500 req/s with a 2 ms gap the generator never slept, burning its core and delaying everything
that shared it (redis-server among them). A ``timerfd`` armed at the absolute due time on
``CLOCK_MONOTONIC`` (the clock of ``time.perf_counter``) wakes the loop's poll within
microseconds of the due time and costs nothing while waiting; the process's timer slack is set
to 1 ns so the kernel does not batch the wake-up (the default slack is 50 µs).

Linux only; :func:`available` says whether it can be used.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time

CLOCK_MONOTONIC = 1
TFD_TIMER_ABSTIME = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = os.O_CLOEXEC
PR_SET_TIMERSLACK = 29


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def available() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return hasattr(_lib(), "timerfd_create")
    except OSError:
        return False


class PreciseTimer:
    """``await timer.until(t)``: resume at ``time.perf_counter() >= t`` (one waiter at a time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        libc = _lib()
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(1), 0, 0, 0)
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._fd = fd
        self._waiter: asyncio.Future[None] | None = None
        self._spec = _Itimerspec()
        self._loop.add_reader(fd, self._fired)

    async def until(self, due: float) -> None:
        if time.perf_counter() >= due:
            return
        sec = int(due)
        self._spec.it_value.tv_sec = sec
        self._spec.it_value.tv_nsec = int((due - sec) * 1e9)
        if _lib().timerfd_settime(self._fd, TFD_TIMER_ABSTIME, ctypes.byref(self._spec),
                                  None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
