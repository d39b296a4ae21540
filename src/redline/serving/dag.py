"""A general graph version served like a model: its handle runs each request's steps.

A :class:`GraphHandle` is a :class:`ModelHandle` (so every edge, the metadata, warm-up, version
policy and hot swaps treat a graph as a model) that runs each request's steps
(``models/dag/execute.py``). Its steps ride the batchers models use, so concurrent requests
reaching a step share one run: a repository model step goes through that model's own handle
(resolved per request, so a hot swap of the model reaches the graph), an in-folder model has a
handle of its own, and a Python step a batcher of its own (``batch: true`` concatenates rows,
else one request a run). Each step is a stage (``step:<name>``) on the request's record; its
recent p99 decides whether it still fits the budget left, and a step that would not fit, raises
or runs out of time answers its declared fallback, the reason in the ``degraded`` output. Plain
models never come here.

Two lanes, as for a model. When every step's batcher would run it at once (idle, the run
short: ``Batcher.would_run_now``), ``infer_now`` runs the whole graph on the spot, each step
through its batcher's ``run_now`` -- no task, future or loop round trip per step, nor for the
request (the edge answers it from the HTTP parser's callback). Otherwise ``infer_queued`` runs
it step by step, each step waiting in its batcher where it must, so under load concurrent
requests share the steps' runs. Both lanes run the same steps with the same budget, stages and
p99 windows; a step stopped on the spot for running long sends the request to the queued lane.
"""

from __future__ import annotations

import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from redline.config import Settings
from redline.errors import DeadlineExceeded, ModelError, RedlineError
from redline.models.dag import (
    DagRunner,
    DagSpec,
    GraphRun,
    NotNow,
    Step,
    StepEnv,
    answer_now,
    model_source,
)
from redline.models.python.session import FailureLog
from redline.serving.batcher import Batcher
from redline.serving.deadline import LOW, TIMER_SLACK_S, now
from redline.serving.handle import ModelHandle
from redline.serving.inline_guard import InlineGuard
from redline.serving.predict.latency import LatencyWindow
from redline.serving.stages import INFERENCE, TIME_FIELDS, RequestRecord, perf_ns

if TYPE_CHECKING:
    from redline.serving.registry import ModelRegistry

log = logging.getLogger("redline.serving")
Arrays = dict[str, np.ndarray]
PYTHON_STEP_THREADS = 4  # an unbatched Python step's runs at once (one request each)


class GraphHandle(ModelHandle):
    """A graph version ready to serve: the steps' handles and batchers, their p99 windows."""

    # No warm-up requests: they would run the real steps (their batchers, p99 windows, the
    # repository models' counters) and a user's slow step; the steps' models warm themselves.
    warm_requests = False
    steps_on_record = True

    def __init__(self, session: DagRunner, settings: Settings,
                 registry: ModelRegistry) -> None:
        super().__init__(session, settings)
        self.dag = session
        self.registry = registry
        self.log_failure = FailureLog()
        self._local = {name: ModelHandle(runner, settings)
                       for name, runner in session.local.items()}
        self._pool = ThreadPoolExecutor(PYTHON_STEP_THREADS,
                                        thread_name_prefix=f"graph-{self.name}")
        cfg = settings.pipeline
        # A recent p99 only for the steps something steers by (``skip_reason``): a step with a
        # fallback, and a cascade's members after its first. Kept for every step, it cost a
        # plain graph's request a clock read and two appends a step that nothing read.
        spec = session.spec
        self._p99 = {name: LatencyWindow(cfg.latency_window, cfg.latency_window_s,
                                         cfg.probe_interval_ms / 1000.0)
                     for name in _steered(spec)}
        self.step_stages = tuple(f"step:{name}" for name in spec.steps)
        self._stage = dict(zip(spec.steps, self.step_stages, strict=True))
        self.step_columns = {stage: TIME_FIELDS + i for i, stage in enumerate(self.step_stages)}
        self._python: dict[str, Batcher] = {}
        for step in session.spec.steps.values():
            if step.kind == "python":
                self._python[step.name] = self._step_batcher(step, settings)
        self._sources = {s.name: model_source(s) for s in session.spec.steps.values()
                         if s.kind == "model" and s.name not in self._local}
        # The steps a request may run (cascades' members too), each with its batcher or handle:
        # what answering on the spot asks first.
        runs = set(spec.order) | set(spec.members())
        self._leaves = [spec.steps[n] for n in spec.steps
                        if n in runs and spec.steps[n].kind in ("model", "python")]

    def _step_batcher(self, step: Step, settings: Settings) -> Batcher:
        label = f"{self.name}:{step.name}"
        return Batcher(
            functools.partial(self._call_python, step), settings.batching_for(self.name),
            executor=self._pool, batchable=step.batch, slo_s=self.slo_ms / 1000.0,
            name=label, inline=True, guard=InlineGuard(label), cut_late=True,
            max_running=1 if step.batch else PYTHON_STEP_THREADS)

    def _call_python(self, step: Step, inputs: Arrays) -> Arrays:
        first = next(iter(inputs.values()))
        try:
            return self.dag.call_python(step, inputs, int(first.shape[0]))
        except ModelError as exc:
            self.log_failure(str(exc.details.get("key", step.name)) + step.name, exc.message,
                             str(exc.details.get("traceback", "")))
            raise ModelError(exc.message, model=self.name) from None

    # ------------------------------------------------------------------ requests
    def infer_now(self, inputs: Arrays, rows: int, record: RequestRecord | None = None,
                  deadline: float | None = None) -> Arrays | None:
        """The graph's outputs computed on the spot, when every step would run at once; else
        None, and :meth:`infer_queued` runs it (see the module doc)."""
        if not self._ready(rows):
            return None
        env = _OnTheSpot(self, deadline, LOW, record)
        run = GraphRun(self.dag.spec, self.dag.signatures, self.dag.schedule, env, self.name)
        mark = len(record.spans) if record is not None else 0
        t0 = perf_ns()
        outputs = answer_now(run, inputs, rows, env.run_now)
        if outputs is None:  # a step was stopped for running long: the queued lane runs it
            if record is not None:
                del record.spans[mark:]
            return None
        self.stats.admitted += 1  # (synchronous: admitted and served in the same call)
        self._answered(run, inputs, outputs, rows, record, t0)
        return outputs

    async def infer_queued(self, inputs: Arrays, rows: int, deadline: float | None,
                           priority: int = LOW, record: RequestRecord | None = None) -> Arrays:
        run = GraphRun(self.dag.spec, self.dag.signatures, self.dag.schedule,
                       _RequestEnv(self, deadline, priority, record), self.name)
        t0 = perf_ns()
        self.stats.admitted += 1  # the graph's own requests (its steps count theirs)
        outputs = await run.answer(inputs, rows)
        self._answered(run, inputs, outputs, rows, record, t0)
        return outputs

    def _answered(self, run: GraphRun, inputs: Arrays, outputs: Arrays, rows: int,
                  record: RequestRecord | None, t0: int) -> None:
        stats = self.stats
        stats.served += 1
        stats.rows += rows
        if record is not None:
            record.add(INFERENCE, t0, perf_ns())
            if run.reasons:
                record.path = "fallback"
                attrs = record.attributes
                if attrs is None:
                    attrs = record.attributes = {}
                attrs["degraded_reasons"] = list(run.reasons)
            self.keep_io_on(record, inputs, outputs, t0)

    def _ready(self, rows: int) -> bool:
        """Whether every step would run at once (``Batcher.would_run_now``); a repository
        model that cannot be had now is left to the queued lane, which reports it."""
        try:
            for step in self._leaves:
                batcher = (self._python[step.name] if step.kind == "python"
                           else self._model(step).batcher)
                if not batcher.would_run_now(rows):
                    return False
        except RedlineError:
            return False
        return True

    def _model(self, step: Step) -> ModelHandle:
        handle = self._local.get(step.name)
        if handle is None:
            name, version = self._sources[step.name]  # type: ignore[misc]
            handle = self.registry.get(name, version)
        return handle

    def _check_deadline(self, step: Step, deadline: float | None) -> None:
        if deadline is not None and deadline - now() <= 0:
            raise DeadlineExceeded(f"graph '{self.name}' step '{step.name}': the request's "
                                   "budget ran out before it could start")

    async def run_step(self, step: Step, inputs: Arrays, rows: int, deadline: float | None,
                       priority: int) -> Arrays:
        """One ``model`` or ``python`` step through its batcher, within ``deadline``."""
        self._check_deadline(step, deadline)
        if step.kind == "python":
            batcher = self._python[step.name]
            out = batcher.run_now(inputs, rows)
            return out if out is not None else await batcher.submit(inputs, rows, deadline,
                                                                    priority)
        return await self._model(step).infer(inputs, deadline, priority=priority)

    def run_step_now(self, step: Step, inputs: Arrays, rows: int,
                     deadline: float | None) -> Arrays | None:
        """One ``model`` or ``python`` step run at once (its batcher's ``run_now``), or None:
        it must wait."""
        self._check_deadline(step, deadline)
        if step.kind == "python":
            return self._python[step.name].run_now(inputs, rows)
        handle = self._model(step)
        checked, rows = handle.prepare(inputs)
        return handle.infer_now(checked, rows, None, deadline)

    def skip_reason(self, step: Step, deadline: float | None) -> str | None:
        if deadline is None:
            return None
        left = deadline - now()
        window = self._p99[step.name]
        p99 = window.estimate()
        if left >= p99 + TIMER_SLACK_S or (left > 0 and window.probe()):
            return None
        return (f"{max(left, 0.0) * 1e3:.2f} ms of budget left, below its recent p99 of "
                f"{p99 * 1e3:.2f} ms")

    # ------------------------------------------------------------------ lifecycle
    def warm(self) -> None:
        """Warm the in-folder models; repository models warm as themselves, and a graph run
        here could reach a model that is not loaded yet."""
        for handle in self._local.values():
            handle.warm()

    async def retire(self, timeout_s: float) -> None:
        for batcher in self._python.values():
            await batcher.drain(timeout_s)
        for handle in self._local.values():
            await handle.retire(timeout_s)  # closes the in-folder models' runners
        self._pool.shutdown(wait=False)
        await super().retire(timeout_s)


def _steered(spec: DagSpec) -> list[str]:
    """The steps whose recent p99 decides whether they run: those with a fallback (skipped
    when the budget left is below it) and a cascade's members after its first (the one before
    answers when the next would not fit)."""
    return [s.name for s in spec.steps.values() if s.fallback is not None] + [
        m for s in spec.steps.values() if s.kind == "cascade" for m in s.members[1:]]


class _RequestEnv(StepEnv):
    """One request's view of its graph's steps: its deadline, priority and record."""

    __slots__ = ("handle", "deadline", "priority", "record")

    def __init__(self, handle: GraphHandle, deadline: float | None, priority: int,
                 record: RequestRecord | None) -> None:
        self.handle = handle
        self.deadline = deadline
        self.priority = priority
        self.record = record

    async def run(self, step: Step, inputs: Arrays, rows: int) -> Arrays:
        return await self.handle.run_step(step, inputs, rows, self.deadline, self.priority)

    def skip_reason(self, step: Step) -> str | None:
        return self.handle.skip_reason(step, self.deadline)

    def observe(self, step: Step, start_ns: int, end_ns: int, ran: bool) -> None:
        handle = self.handle
        if self.record is not None:
            self.record.spans.append((handle._stage[step.name], start_ns, end_ns))
        if ran:  # a failure's time counts too: a step that runs out of time is that slow
            window = handle._p99.get(step.name)
            if window is not None:
                window.add((end_ns - start_ns) / 1e9)


class _OnTheSpot(_RequestEnv):
    """A request whose steps all run at once (``GraphHandle.infer_now``): a step that would
    have to wait raises ``NotNow``."""

    __slots__ = ()

    async def run(self, step: Step, inputs: Arrays, rows: int) -> Arrays:
        out = self.run_now(step, inputs, rows)
        if out is None:
            raise NotNow
        return out

    def run_now(self, step: Step, inputs: Arrays, rows: int) -> Arrays | None:
        return self.handle.run_step_now(step, inputs, rows, self.deadline)
