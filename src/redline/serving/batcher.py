"""Dynamic batching per model version: pack queued requests into one run, split the results.

Shape of the fast path, and why: the batcher is a small state machine driven by event-loop
callbacks, not a task per request or a background coroutine. A request appends itself to a queue
and, when nothing is running, schedules one ``_flush`` with ``call_soon``; requests that arrive in
the same loop iteration (or while a batch runs) ride the next batch — "natural" batching that
adds no delay at concurrency 1. Measured against a bare ASGI callable, a task per request or an
``asyncio.Queue`` consumer cost 20-40 µs per request on this class of machine; callbacks cost a
few.

Where a batch runs: a run predicted to take less than ``inline_max_us`` (a one-row forest:
10-60 µs, depending on the machine and its load) happens inline on the loop, and when the
batcher is idle the request runs at once without queueing at all — for such runs a thread hop
or a loop round trip costs more than batching saves. Longer runs go to the model's own worker
thread (ONNX Runtime releases the GIL), so the loop keeps answering health checks and metadata
and keeps accepting requests, which queue and ride the next batch.

A model that runs the user's own Python (``model.py``; the runner's ``user_code``) may hang, so
it runs on the loop only under an ``InlineGuard`` (``serving/inline_guard.py``), which stops a run
that outlives a couple of milliseconds and sends the batch to a worker thread instead; without a
usable guard it never runs on the loop. While its batch runs on a thread, each request is
answered at its own deadline (``DeadlineExceeded``) rather than when the run ends. A run that
every request has given up on is abandoned: the runner is told (``abandon``: a worker process is
stopped) and the next batch starts on another thread of the version's pool.

Options (``BatchingSettings``): ``max_batch_size`` rows per run; ``max_queue_size`` requests
waiting (beyond it: 429); ``max_queue_delay_us`` how long to hold a partial batch for more rows,
applied only once concurrency has been seen (so a lone client never waits); ``adaptive`` grows
the batch by one row while the slowest request of each batch finishes within the objective and
halves it when one does not (additive increase, multiplicative decrease).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from concurrent.futures import Future as ThreadFuture
from typing import Any

import numpy as np

from redline.config import BatchingSettings
from redline.errors import (
    DeadlineExceeded,
    ModelFailed,
    ModelNotReady,
    Overloaded,
    RedlineError,
    describe,
)
from redline.serving.deadline import HIGH, TIMER_SLACK_S, AdmissionStats, CostModel, now
from redline.serving.inline_guard import InlineGuard, RanTooLong

log = logging.getLogger("redline.serving")
Inputs = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray]
# An idle request the estimate sends to the queue runs inline anyway, once in PROBE_EVERY,
# when its prediction is within PROBE_RANGE times ``inline_max_us`` (see ``run_now``).
PROBE_EVERY = 16
PROBE_RANGE = 4.0


class _Run:
    """A batch on a worker thread: its requests, and (with ``cut_late``) the timer that answers
    them at their deadlines."""

    __slots__ = ("batch", "rows", "thread", "timer", "abandoned")

    def __init__(self, batch: list[_Entry], rows: int) -> None:
        self.batch = batch
        self.rows = rows
        self.thread: int | None = None  # the worker thread's id, once the run starts
        self.timer: asyncio.TimerHandle | None = None
        self.abandoned = False


class _Entry:
    __slots__ = ("inputs", "rows", "future", "deadline", "arrival", "key")

    def __init__(
        self, inputs: Inputs, rows: int, future: asyncio.Future[Outputs], deadline: float | None,
        arrival: float, key: tuple[Any, ...],
    ) -> None:
        self.inputs = inputs
        self.rows = rows
        self.future = future
        self.deadline = deadline
        self.arrival = arrival
        self.key = key


class Batcher:
    """Queues requests for one model version and runs them in batches.

    ``run`` is the model's hot path (``InferenceSession.run``); ``batchable`` says whether every
    input and output has a dynamic first (batch) dimension, so requests can be concatenated.
    ``inline=False`` keeps every run off the event loop, and ``guard`` lets a run on the loop
    only when the guard allows it, and stops it at the guard's limit; ``cut_late`` answers a
    running batch's requests at their deadlines and abandons the run (calling
    ``abandon(thread_id)``) once none waits; ``max_running`` batches may run at once (a Python
    model's worker processes).
    """

    def __init__(
        self,
        run: Callable[[Inputs], Outputs],
        settings: BatchingSettings,
        *,
        executor: Executor,
        batchable: bool = True,
        slo_s: float = 0.1,
        cost: CostModel | None = None,
        stats: AdmissionStats | None = None,
        name: str = "model",
        inline: bool = True,
        cut_late: bool = False,
        max_running: int = 1,
        abandon: Callable[[int], None] | None = None,
        guard: InlineGuard | None = None,
    ) -> None:
        self._run = run
        self._executor = executor
        self.settings = settings
        self.batchable = batchable and settings.enabled
        self.max_batch = max(1, settings.max_batch_size) if self.batchable else 1
        # Adaptive mode starts small and earns its batch size; fixed mode uses the maximum.
        self.cap = 1 if settings.adaptive else self.max_batch
        self.slo_s = slo_s
        self.cost = cost or CostModel()
        self.stats = stats or AdmissionStats()
        self.name = name
        # -1: no run is ever predicted short enough for the loop
        self._inline_max_s = settings.inline_max_us / 1e6 if inline else -1.0
        self._cut_late = cut_late
        self._guard = guard
        self._max_running = max(1, max_running)
        self._abandon = abandon
        self.abandoned = 0  # runs given up on, past every request's deadline
        self._warned_abandoned = -math.inf
        self._delay_s = settings.max_queue_delay_us / 1e6
        self._queues: tuple[deque[_Entry], deque[_Entry]] = (deque(), deque())
        self._queued = 0
        self._queued_rows = 0
        self._scheduled = False  # a _flush is pending on the loop
        self._running = 0  # batches on worker threads that requests still wait for
        self._busy_until = 0.0  # predicted end of the latest running batch
        self._concurrent = False  # the last batch held more than one request
        self._closed = False
        self._tick = 0  # fast-path runs, for sampling their timing
        self._declined = 0  # idle requests sent to the queue by the estimate, for probes
        # How long the last delivered batch ran: a request resumed by that delivery splits its
        # wait into queue and inference with it (serving/stages.py).
        self.last_run_s = 0.0
        self._idle: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ submit
    def run_now(self, inputs: Inputs, rows: int) -> Outputs | None:
        """The idle fast path: run a short request at once, or return None to ``submit`` it.

        Applies when nothing is queued or running and the run is predicted shorter than
        ``inline_max_us``: then no queue, no future and no loop round trip — batching such a
        run would save less than they cost. Requests still batch whenever they find work
        queued or running.
        """
        if self._queued or self._running or self._scheduled or self._closed:
            return None
        guard = self._guard
        if guard is not None and not guard.allows():
            return None
        cost = self.cost
        predicted = cost.fixed_s + cost.per_row_s * rows
        if predicted > self._inline_max_s:
            # Case: predicted too long for the loop. A run on the worker thread is timed with
            # its wait for the GIL afterwards, so under load the estimate can climb past the
            # limit and, with thread runs alone to measure it, stay there.
            # One declined idle request in PROBE_EVERY, when near the limit, runs here and is
            # timed, so the estimate comes back by itself once the runs are short again.
            self._declined += 1
            if self._declined % PROBE_EVERY or predicted > PROBE_RANGE * self._inline_max_s:
                return None
            timed = True
        else:
            # Timing every run costs more than the run at one row: sample one in eight.
            self._tick += 1
            timed = not self._tick & 7
        t0 = now() if timed else 0.0
        try:
            outputs = self._run(inputs) if guard is None else guard.run(self._run, inputs)
        except RanTooLong:
            guard.tripped()  # type: ignore[union-attr]
            return None  # the request is queued: it runs on a worker thread
        except RedlineError:
            raise
        except Exception as exc:  # noqa: BLE001 - same message as a failed batch
            raise self._model_failed(exc) from None
        if timed:
            cost.observe(rows, now() - t0)
        stats = self.stats
        stats.admitted += 1
        stats.served += 1
        stats.batches += 1
        stats.rows += rows
        return outputs

    def would_run_now(self, rows: int) -> bool:
        """Whether :meth:`run_now` would run ``rows`` rows at once (its probes aside): what a
        caller that must run several batchers' requests in one go (a graph's steps) asks of
        each before it starts any. The same conditions as ``run_now``'s."""
        if self._queued or self._running or self._scheduled or self._closed:
            return False
        guard = self._guard
        if guard is not None and not guard.allows():
            return False
        cost = self.cost
        return cost.fixed_s + cost.per_row_s * rows <= self._inline_max_s

    def submit(
        self, inputs: Inputs, rows: int, deadline: float | None = None, priority: int = 1
    ) -> asyncio.Future[Outputs]:
        """Queue validated inputs; the future resolves to this request's slice of the outputs."""
        if self._closed:
            raise ModelNotReady(f"model '{self.name}' is unloading; retry to reach its successor")
        if self._queued >= self.settings.max_queue_size:
            self.stats.shed_queue_full += 1
            raise Overloaded(
                f"model '{self.name}' has {self._queued} requests queued (max_queue_size "
                f"{self.settings.max_queue_size}); retry after the indicated delay or add replicas",
                retry_after_s=self._drain_estimate(),
            )
        t = now()
        if deadline is not None and (self._queued or self._running):
            finish = self._finish_estimate(t, rows)
            if finish > deadline:
                self.stats.shed_budget += 1
                raise Overloaded(
                    f"model '{self.name}' cannot answer within the request's budget: about "
                    f"{(finish - t) * 1e3:.1f} ms of work is queued ahead and "
                    f"{max(0.0, deadline - t) * 1e3:.1f} ms of budget is left",
                    retry_after_s=self._drain_estimate(),
                )
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()
        key = tuple(a.shape[1:] for a in inputs.values()) if self.batchable else ()
        entry = _Entry(inputs, rows, future, deadline, t, key)
        self._queues[0 if priority == HIGH else 1].append(entry)
        self._queued += 1
        self._queued_rows += rows
        self.stats.admitted += 1
        if not self._scheduled and self._running < self._max_running:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def _finish_estimate(self, t: float, rows: int) -> float:
        ahead = self._queued_rows + rows
        runs = math.ceil(ahead / (self.cap * self._max_running))
        start = max(t, self._busy_until) if self._running >= self._max_running else t
        return start + runs * self.cost.predict(min(ahead, self.cap))

    def _drain_estimate(self) -> float:
        runs = math.ceil(max(1, self._queued_rows) / self.cap)
        return max(0.001, runs * self.cost.predict(self.cap))

    # ------------------------------------------------------------------ flush
    def _flush(self) -> None:
        self._scheduled = False
        if self._running >= self._max_running or not self._queued:
            return
        # Hold a partial batch for more rows, only once concurrency has been seen.
        if self._delay_s and self._concurrent and self._queued_rows < self.cap:
            oldest = min(q[0].arrival for q in self._queues if q)
            if now() - oldest < self._delay_s:
                self._scheduled = True
                assert self._loop is not None
                self._loop.call_soon(self._flush)  # yields to I/O: new requests can join
                return
        batch, rows = self._take()
        if not batch:
            self._notify_idle()
            return
        self._concurrent = len(batch) > 1
        try:
            merged = self._merge(batch)
        except Exception as exc:  # noqa: BLE001 - a failed merge fails this batch only
            self._fail(batch, exc)
            self._schedule_next()
            return
        predicted = self.cost.predict(rows)
        guard = self._guard
        if predicted <= self._inline_max_s and (guard is None or guard.allows()):
            # Case: a short run — cheaper inline than a thread hop.
            t0 = now()
            try:
                outputs = self._run(merged) if guard is None else guard.run(self._run, merged)
            except RanTooLong:
                guard.tripped()  # type: ignore[union-attr]  # and on to a worker thread
            except Exception as exc:  # noqa: BLE001
                self._fail(batch, exc)
                self._schedule_next()
                return
            else:
                self._deliver(batch, rows, outputs, now() - t0)
                self._schedule_next()
                return
        # Case: a long run (or the user's code) — on a worker thread, the loop stays responsive.
        self._running += 1
        self._busy_until = now() + predicted
        loop = self._loop
        assert loop is not None
        run = _Run(batch, rows)
        work = self._executor.submit(self._timed_run, merged, run)

        def done(f: ThreadFuture[tuple[Outputs, float]]) -> None:
            loop.call_soon_threadsafe(self._on_thread_done, run, f)

        work.add_done_callback(done)
        if self._cut_late:
            self._arm(run)
        if self._queued and self._running < self._max_running and not self._scheduled:
            self._scheduled = True  # another batch may run beside this one
            loop.call_soon(self._flush)

    def _timed_run(self, merged: Inputs, run: _Run) -> tuple[Outputs, float]:
        run.thread = threading.get_ident()
        t0 = now()
        outputs = self._run(merged)
        return outputs, now() - t0

    def _arm(self, run: _Run) -> None:
        """Wake at the earliest deadline of the run's requests still waiting."""
        deadlines = [e.deadline for e in run.batch
                     if e.deadline is not None and not e.future.done()]
        if deadlines and self._loop is not None:
            run.timer = self._loop.call_later(max(0.0, min(deadlines) - now()), self._cut, run)

    def _cut(self, run: _Run) -> None:
        """Answer the run's requests whose budget is spent; abandon the run once none waits."""
        run.timer = None
        t = now()
        waiting = 0
        for entry in run.batch:
            if entry.future.done():
                continue
            if entry.deadline is not None and entry.deadline <= t + TIMER_SLACK_S:
                self.stats.expired += 1
                entry.future.set_exception(DeadlineExceeded(
                    f"model '{self.name}' did not answer within the request's budget: its run "
                    f"had taken {(t - entry.arrival) * 1e3:.0f} ms and is still going; raise "
                    "x-redline-budget-ms if the model is that slow, or fix a predict that hangs"
                ))
            else:
                waiting += 1
        if waiting:
            self._arm(run)
            return
        # Case: nobody waits for this run any more — give its slot to the next batch.
        run.abandoned = True
        self._running -= 1
        self.abandoned += 1
        if t - self._warned_abandoned >= 60.0:
            self._warned_abandoned = t
            log.warning("model '%s': a run outlived the budget of every request in it and was "
                        "abandoned (%d so far); the next batch runs on another thread",
                        self.name, self.abandoned)
        if self._abandon is not None and run.thread is not None:
            self._abandon(run.thread)
        self._schedule_next()

    def _on_thread_done(self, run: _Run, work: ThreadFuture[tuple[Outputs, float]]) -> None:
        if run.abandoned:
            return  # its requests were answered at their deadlines
        if run.timer is not None:
            run.timer.cancel()
        self._running -= 1
        batch, rows = run.batch, run.rows
        exc = work.exception()
        if exc is not None:
            self._fail(batch, exc)
        else:
            outputs, seconds = work.result()
            self._deliver(batch, rows, outputs, seconds)
        self._schedule_next()

    def _schedule_next(self) -> None:
        if self._queued and not self._scheduled:
            self._scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)
        elif not self._queued:
            self._notify_idle()

    def _take(self) -> tuple[list[_Entry], int]:
        """Up to ``cap`` rows of compatible requests, high priority first; expired ones dropped."""
        batch: list[_Entry] = []
        rows = 0
        t = now()
        key = None
        for queue in self._queues:
            while queue:
                entry = queue[0]
                if entry.future.cancelled():
                    self._pop(queue)
                    continue
                if entry.deadline is not None and entry.deadline < t:
                    self._pop(queue)
                    self.stats.expired += 1
                    entry.future.set_exception(DeadlineExceeded(
                        f"the request's budget ran out after {(t - entry.arrival) * 1e3:.1f} ms "
                        f"in the queue of model '{self.name}'; raise x-redline-budget-ms or "
                        "reduce load"
                    ))
                    continue
                if batch and (rows + entry.rows > self.cap or entry.key != key):
                    return batch, rows
                self._pop(queue)
                batch.append(entry)
                rows += entry.rows
                key = entry.key
                if not self.batchable:
                    return batch, rows
        return batch, rows

    def _pop(self, queue: deque[_Entry]) -> None:
        entry = queue.popleft()
        self._queued -= 1
        self._queued_rows -= entry.rows

    @staticmethod
    def _merge(batch: list[_Entry]) -> Inputs:
        if len(batch) == 1:
            return batch[0].inputs
        first = batch[0].inputs
        return {name: np.concatenate([e.inputs[name] for e in batch]) for name in first}

    def _deliver(self, batch: list[_Entry], rows: int, outputs: Outputs, seconds: float) -> None:
        self.cost.observe(rows, seconds)
        self.last_run_s = seconds
        stats = self.stats
        stats.batches += 1
        stats.rows += rows
        stats.served += len(batch)
        if len(batch) == 1:
            future = batch[0].future
            if not future.done():
                future.set_result(outputs)
        else:
            offset = 0
            for entry in batch:
                end = offset + entry.rows
                if not entry.future.done():
                    entry.future.set_result({k: v[offset:end] for k, v in outputs.items()})
                offset = end
        if self.settings.adaptive:
            self._adapt(batch, rows)

    def _adapt(self, batch: list[_Entry], rows: int) -> None:
        """AIMD on the batch size against the latency objective."""
        worst = now() - min(e.arrival for e in batch)
        if worst > self.slo_s * self.settings.adaptive_target:
            self.cap = max(1, self.cap // 2)
        elif rows >= self.cap:
            self.cap = min(self.max_batch, self.cap + 1)

    def _model_failed(self, exc: BaseException) -> ModelFailed:
        """The error a request gets when the model raised; logged once, as one line."""
        reason = describe(exc)
        log.error("model '%s' failed to run: %s", self.name, reason)
        return ModelFailed(f"model '{self.name}' failed to run: {reason}", model=self.name)

    def _fail(self, batch: list[_Entry], exc: BaseException) -> None:
        if not isinstance(exc, RedlineError):
            exc = self._model_failed(exc)
        for entry in batch:
            if not entry.future.done():
                entry.future.set_exception(exc)

    # ------------------------------------------------------------------ lifecycle
    @property
    def queued(self) -> int:
        return self._queued

    @property
    def idle(self) -> bool:
        return not self._queued and not self._running

    def _notify_idle(self) -> None:
        if self._idle is not None and self.idle:
            self._idle.set()

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Stop admitting and wait until queued and running batches are done."""
        self._closed = True
        if self.idle:
            return True
        self._idle = asyncio.Event()
        if self.idle:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
