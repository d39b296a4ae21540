"""The inline guard: a user's Python runs on the event loop until it runs long, then it is
stopped and its batch goes to a worker thread, where the budget answers for it.

pytest runs tests (and pytest-asyncio's loops) on the main thread, where the guard works.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from redline.config import BatchingSettings
from redline.errors import DeadlineExceeded
from redline.serving import inline_guard
from redline.serving.batcher import Batcher
from redline.serving.deadline import now
from redline.serving.inline_guard import InlineGuard, RanTooLong
from tests.serving.helpers import lend_sigalrm

pytestmark = pytest.mark.allow_log(r"model 'm(:1)?': a run (on the event loop|outlived)")


@pytest.fixture(autouse=True)
def sigalrm_free() -> Iterator[None]:
    with lend_sigalrm():
        yield


def test_the_guard_leaves_another_owner_of_the_signal_alone() -> None:
    signal.signal(signal.SIGALRM, lambda *_: None)
    assert not InlineGuard("m").allows()


def test_a_guarded_run_is_stopped_at_its_limit_even_in_a_sleep() -> None:
    guard = InlineGuard("m", limit_s=0.005)
    assert guard.allows()
    t0 = time.monotonic()
    with pytest.raises(RanTooLong):
        guard.run(time.sleep, 5)
    assert time.monotonic() - t0 < 1.0

    def spin(_: object) -> None:
        while True:
            pass

    with pytest.raises(RanTooLong):
        guard.run(spin, None)
    assert guard.run(lambda x: x + 1, 1) == 2  # quick runs are untouched...
    time.sleep(0.01)  # ...and the alarm left pending after one lapses harmlessly
    guard.tripped()
    assert not guard.allows()  # off the loop while it cools down


def test_quick_runs_share_one_alarm_and_a_long_one_after_them_is_still_stopped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in quick succession arm the timer about once per half limit, not once each (two
    system calls a run were a measurable share of a Python graph's server), and an alarm left
    pending by an earlier run neither stops a later run early nor lets it run past its limit."""
    armed: list[float] = []
    setitimer = signal.setitimer

    def counted(which: int, seconds: float, interval: float = 0.0) -> tuple[float, float]:
        armed.append(seconds)
        return setitimer(which, seconds, interval)

    monkeypatch.setattr(signal, "setitimer", counted)
    guard = InlineGuard("m", limit_s=0.004)
    assert guard.allows()
    t0 = time.perf_counter()
    for _ in range(2000):
        assert guard.run(_spin_cpu, 0.00001) is None
    elapsed = time.perf_counter() - t0
    assert len(armed) <= elapsed / 0.002 * 2 + 2, (len(armed), elapsed)
    assert len(armed) < 2000 / 4  # far fewer than one a run

    # A run that starts just before a pending alarm fires runs its own half limit first...
    time.sleep(0.005)  # the last alarm lapses
    guard.run(_spin_cpu, 0.0)  # arms one, 2 ms ahead...
    time.sleep(0.0015)  # ...and about 0.5 ms ahead (or less) when the next run starts
    t0 = time.perf_counter()
    assert guard.run(_spin_cpu, 0.0026) is None  # looking at 0.5 ms would stop it at 2.5 ms
    # ...and one that runs long is stopped at its limit however the alarm was left.
    with pytest.raises(RanTooLong):
        guard.run(_spin_cpu, 0.050)
    assert time.perf_counter() - t0 < 0.040


def test_a_process_that_exits_right_after_a_run_is_not_killed_by_the_pending_alarm() -> None:
    code = ("from redline.serving.inline_guard import InlineGuard\n"
            "guard = InlineGuard('m', limit_s=0.004)\n"
            "assert guard.allows() and guard.run(abs, -1) == 1\n")  # the alarm: during the exit
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


def test_stops_in_a_row_lengthen_the_pause_and_a_lone_one_does_not() -> None:
    guard = InlineGuard("m", cooldown_s=0.2, max_cooldown_s=0.6)
    guard.tripped()
    assert guard.cooldown_s == 0.2
    time.sleep(0.21)
    guard.tripped()  # just after the pause ended: twice as long
    assert guard.cooldown_s == 0.4
    time.sleep(0.41)
    guard.tripped()
    assert guard.cooldown_s == 0.6  # at most max_cooldown_s
    time.sleep(1.5)
    guard.tripped()  # long after: back to the first pause
    assert guard.cooldown_s == 0.2


def test_off_the_main_thread_the_guard_allows_nothing() -> None:
    said: list[bool] = []
    thread = threading.Thread(target=lambda: said.append(InlineGuard("m").allows()))
    thread.start()
    thread.join()
    assert said == [False]


class Moody:
    """A model run: fast, except rows whose first value is 99, which sleep ``hang_s``."""

    def __init__(self, hang_s: float) -> None:
        self.hang_s = hang_s
        self.threads: list[int] = []

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        self.threads.append(threading.get_ident())
        if (x[:, 0] == 99).any():
            time.sleep(self.hang_s)
        return {"y": x.sum(axis=1)}


async def test_a_hang_on_the_loop_is_stopped_then_cut_by_its_budget() -> None:
    model = Moody(hang_s=1.5)
    guard = InlineGuard("m:1", limit_s=0.003, cooldown_s=0.5)
    with ThreadPoolExecutor(4) as pool:
        batcher = Batcher(model, BatchingSettings(), executor=pool, cut_late=True, guard=guard,
                          name="m:1")
        fast = {"x": np.ones((1, 4), np.float32)}
        assert batcher.run_now(fast, 1)["y"].tolist() == [4.0]  # on the loop's thread
        assert model.threads == [threading.get_ident()]
        hang = {"x": np.full((1, 4), 99, np.float32)}
        t0 = now()
        assert batcher.run_now(hang, 1) is None  # stopped at the guard's limit...
        assert now() - t0 < 0.5 and guard.stopped == 1
        with pytest.raises(DeadlineExceeded, match="still going"):  # ...run again on a thread
            await batcher.submit(hang, 1, deadline=now() + 0.2)
        assert now() - t0 < 1.0
        # The loop and the model go on: the next batch runs on another thread of the pool
        # while the hung run still sleeps.
        out = await asyncio.wait_for(batcher.submit(fast, 1, deadline=now() + 1.0), 1.0)
        assert out["y"].tolist() == [4.0] and batcher.abandoned == 1
        assert model.threads[-1] != threading.get_ident()
        await asyncio.sleep(0.5)  # cooled down: short runs are back on the loop
        assert batcher.run_now(fast, 1) is not None
        assert model.threads[-1] == threading.get_ident()


def _spin_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies


def test_a_run_preempted_by_other_processes_is_not_stopped_and_a_long_one_is() -> None:
    """Three processes spinning on this test's CPU take most of it: a run that needs 0.4 ms of
    CPU then takes several milliseconds of wall time, waiting for the CPU. That wait is not the
    run's: a 2 ms guard lets it finish; a run that needs 10 ms of CPU is still stopped."""
    assert inline_guard.run_queue_wait_ns() is not None, (
        f"{inline_guard.SCHEDSTAT} is unreadable: the guard would count wall time")
    cpus = os.sched_getaffinity(0)
    cpu = min(cpus)

    def pinned_and_tied() -> None:
        """On this test's CPU, and SIGKILLed when the process that started it dies (killed,
        or timed out past its ``finally``): a hog left over takes that CPU from every later
        run on the machine."""
        os.sched_setaffinity(0, {cpu})
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             preexec_fn=pinned_and_tied)
            for _ in range(3)]
    try:
        os.sched_setaffinity(0, {cpu})
        guard = InlineGuard("m", limit_s=0.002)
        assert guard.allows()
        walls: list[float] = []
        until = time.monotonic() + 5.0  # the hogs take a moment to start spinning
        while (len(walls) < 20 or max(walls) <= 0.004) and time.monotonic() < until:
            t0 = time.perf_counter()
            guard.run(_spin_cpu, 0.0004)  # never RanTooLong
            walls.append(time.perf_counter() - t0)
        # some runs did wait: twice the limit of wall time (else this proves nothing)
        assert max(walls) > 0.004, walls
        t0 = time.perf_counter()
        with pytest.raises(RanTooLong):
            guard.run(_spin_cpu, 0.010)
        assert time.perf_counter() - t0 < 0.2
    finally:
        os.sched_setaffinity(0, cpus)
        for hog in hogs:
            hog.kill()
            hog.wait()
