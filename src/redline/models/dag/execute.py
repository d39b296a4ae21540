"""One request through a graph: each step as soon as the steps it reads have answered.

Why two ways to run: a chain of steps (the common featurize -> model -> post-step shape, or any
graph whose steps each read the one before) runs with no task at all, each step awaited in turn;
a graph with branches that may run together (an ensemble's members, two featurizers) gets a task
per step, each awaiting only the steps it reads, so a slow branch never holds up another. When
every step can run at once on the calling thread (the server's batchers are idle and the runs
short), :func:`answer_now` computes the answer with no task and no loop round trip at all; for
a *plain* graph (no fallback, no cascade: nothing that changes what a step's failure means)
with no coroutine either, in one loop over the steps, their reads parsed once
(``Schedule.reads``): every request otherwise pays for three coroutine frames a step and for
parsing each read again. The ``StepEnv`` runs the leaves (models and Python functions) and
knows the budget: the server's runs them through batchers within the request's budget
(``serving/dag.py``), ``models add``'s sample run calls them directly (``runner.py``); this
module is the one definition of what a graph answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from redline.errors import ModelError, RedlineError
from redline.models.dag.spec import ANSWERED_BY, DEGRADED, DagSpec, Step, split_ref
from redline.models.dag.steps import Arrays, combine, confidence, constant_rows
from redline.models.metadata import TensorSpec


class StepEnv(Protocol):
    """What executing a graph needs from where it runs."""

    async def run(self, step: Step, inputs: Arrays, rows: int) -> Arrays:
        """A ``model`` or ``python`` step's outputs for ``inputs``."""

    def skip_reason(self, step: Step) -> str | None:
        """Why ``step`` should not start now (the budget left is below its recent p99), or
        None: it fits."""

    def observe(self, step: Step, start_ns: int, end_ns: int, ran: bool) -> None:
        """``step`` took from ``start_ns`` to ``end_ns`` (``perf_counter_ns``); ``ran`` is
        False when it was skipped for its fallback (no run its p99 can learn from)."""


class NotNow(BaseException):
    """Raised by a ``StepEnv`` whose step cannot run at once (its batcher is busy, or its run
    was stopped for running long): :func:`answer_now` then leaves the request to the queue.
    A ``BaseException``, so that no step's fallback takes it for a failure."""


RunNow = Callable[[Step, Arrays, int], "Arrays | None"]


def answer_now(run: GraphRun, inputs: Arrays, rows: int,
               run_now: RunNow | None = None) -> Arrays | None:
    """``run``'s answer computed here, every step in turn, or None when a step could not run
    at once (its env raised :class:`NotNow`, or ``run_now`` returned None; the values computed
    so far are dropped). ``run_now(step, inputs, rows)`` runs a ``model`` or ``python`` step at
    once: given it, a plain graph takes :meth:`GraphRun.answer_plain`.

    Why a coroutine driven by hand: what a graph answers (fallbacks, cascades, degraded
    reasons) is written once, in :meth:`GraphRun.answer`; with an env whose ``run`` never
    waits, that coroutine finishes on its first ``send``, with no task, future or loop round
    trip. An env that does wait is a bug, refused here."""
    if run_now is not None and run.schedule.plain:
        return run.answer_plain(inputs, rows, run_now)
    coro = run.answer(inputs, rows, in_order=True)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except NotNow:
        return None
    coro.close()
    raise RuntimeError(f"graph '{run.graph}': a step waited while answering at once")


class GraphRun:
    """The values of one request's steps as they are computed, and why it degraded."""

    def __init__(self, spec: DagSpec, signatures: dict[str, list[TensorSpec] | None],
                 schedule: Schedule, env: StepEnv, graph: str) -> None:
        self.spec = spec
        self.signatures = signatures
        self.schedule = schedule
        self.env = env
        self.graph = graph
        self.values: dict[str, Arrays] = {}
        self.reasons: list[str] = []
        self.inputs: Arrays = {}
        self.rows = 0

    async def answer(self, inputs: Arrays, rows: int, in_order: bool = False) -> Arrays:
        """The graph's outputs for ``inputs`` (``rows`` rows); a step that fails without a
        fallback raises its error. ``in_order``: every step in turn, branches too (its steps
        run at once, so there is nothing to overlap: :func:`answer_now`)."""
        self.inputs, self.rows = inputs, rows
        steps = self.spec.steps
        if in_order or self.schedule.chain:
            for name in self.spec.order:
                await self._step(steps[name])
        else:
            await self._dataflow()
        out = {name: self._read(ref, f"output '{name}'") for name, ref in
               self.spec.outputs.items()}
        if self.schedule.degrades and DEGRADED not in out:
            why = "; ".join(self.reasons)
            out[DEGRADED] = np.full(rows, why, dtype=object)
        return out

    def answer_plain(self, inputs: Arrays, rows: int, run_now: RunNow) -> Arrays | None:
        """A plain graph's outputs (``Schedule.plain``), every step in turn on this thread; None
        as soon as ``run_now`` cannot run a step at once. The same answer, errors and
        observations as :meth:`answer` gives such a graph (a plain graph never degrades)."""
        self.inputs, self.rows = inputs, rows
        env, values, steps = self.env, self.values, self.spec.steps
        reads = self.schedule.reads
        for name in self.spec.order:
            step = steps[name]
            t0 = time.perf_counter_ns()
            try:
                if step.kind == "ensemble":
                    values[name] = combine(step, [values[m] for m in step.members])
                    continue
                try:
                    args = {k: (values[p] if p else inputs)[o] for k, p, o in reads[name]}
                except KeyError:
                    args = self.inputs_of(step)  # raises the error that names the read
                got = run_now(step, args, rows)
                if got is None:
                    return None
                values[name] = got
            except RedlineError:
                raise
            except Exception as exc:  # noqa: BLE001 - a step's own bug (as in ``_step``)
                raise ModelError(f"graph '{self.graph}' step '{step.name}' failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
            finally:
                env.observe(step, t0, time.perf_counter_ns(), True)
        try:
            return {n: (values[p] if p else inputs)[o] for n, p, o in self.schedule.output_reads}
        except KeyError:
            return {n: self._read(ref, f"output '{n}'") for n, ref in self.spec.outputs.items()}

    async def _dataflow(self) -> None:
        """A task per step, started in order, each awaiting the tasks of what it reads."""
        tasks: dict[str, asyncio.Future[None]] = {}
        steps, deps = self.spec.steps, self.schedule.deps

        async def after(name: str, before: list[asyncio.Future[None]]) -> None:
            if before:
                await asyncio.gather(*before)
            await self._step(steps[name])

        for name in self.spec.order:
            tasks[name] = asyncio.ensure_future(after(name, [tasks[d] for d in deps[name]]))
        await _gather(list(tasks.values()))

    # ------------------------------------------------------------------ one step
    async def _step(self, step: Step) -> None:
        env = self.env
        t0 = time.perf_counter_ns()
        ran = True
        try:
            if step.fallback is not None:
                why = env.skip_reason(step)
                if why is not None:
                    ran = False
                    self.values[step.name] = self._fall_back(step, f"skipped: {why}")
                    return
            self.values[step.name] = await self._compute(step)
        except RedlineError as exc:
            if step.fallback is None:
                raise
            self.values[step.name] = self._fall_back(step, f"failed ({exc.code}): "
                                                           f"{exc.message}")
        except Exception as exc:  # noqa: BLE001 - a step's own bug falls back as declared
            if step.fallback is None:
                raise ModelError(f"graph '{self.graph}' step '{step.name}' failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
            self.values[step.name] = self._fall_back(step, f"failed: {type(exc).__name__}: "
                                                           f"{exc}")
        finally:
            env.observe(step, t0, time.perf_counter_ns(), ran)

    async def _compute(self, step: Step) -> Arrays:
        if step.kind == "ensemble":
            return combine(step, [self.values[m] for m in step.members])
        if step.kind == "cascade":
            return await self._cascade(step)
        return await self.env.run(step, self.inputs_of(step), self.rows)

    def inputs_of(self, step: Step, rows: np.ndarray | None = None) -> Arrays:
        """What ``step`` reads, from this run's values (of ``rows`` only, when given)."""
        where = f"step '{step.name}'"
        got = {k: self._read(ref, where) for k, ref in step.inputs.items()}
        return got if rows is None else {k: v[rows] for k, v in got.items()}

    def _read(self, ref: str, who: str) -> np.ndarray:
        producer, output = split_ref(ref)
        source = self.values[producer] if producer else self.inputs
        try:
            return source[output]
        except KeyError:
            raise ModelError(f"graph '{self.graph}': {who} reads '{ref}' but step "
                             f"'{producer}' returned no '{output}' (it returned "
                             f"{sorted(source)}); return it or read another output") from None

    def _fall_back(self, step: Step, reason: str) -> Arrays:
        fb = step.fallback
        assert fb is not None
        self.reasons.append(f"step '{step.name}' {reason}")
        if fb.step is not None:
            return self.values[fb.step]
        assert fb.values is not None
        return constant_rows(fb.values, self.signatures.get(step.name), self.rows,
                             f"step '{step.name}'")

    # ------------------------------------------------------------------ cascade
    async def _cascade(self, step: Step) -> Arrays:
        """Each row is answered by the first member sure enough of it (its confidence at least
        the member's threshold); the rest go on to the next member, unless the budget left is
        below that member's recent p99: then this member answers them too. A member that fails
        passes its rows on; the last one answers whatever its confidence."""
        env = self.env
        members = [self.spec.steps[m] for m in step.members]
        remaining = np.arange(self.rows)
        answer: Arrays | None = None
        answered_by = np.full(self.rows, "", dtype=object)
        error: Exception | None = None
        for i, member in enumerate(members):
            last = i == len(members) - 1
            sub = None if remaining.size == self.rows else remaining
            t0 = time.perf_counter_ns()
            try:
                got = await env.run(member, self.inputs_of(member, sub), remaining.size)
            except Exception as exc:  # noqa: BLE001 - the next member takes its rows
                env.observe(member, t0, time.perf_counter_ns(), True)
                error = exc
                text = exc.message if isinstance(exc, RedlineError) else str(exc)
                if last:
                    raise
                self.reasons.append(f"step '{member.name}' failed ({text}); "
                                    f"'{members[i + 1].name}' answered its rows")
                continue
            env.observe(member, t0, time.perf_counter_ns(), True)
            if last:
                sure = np.ones(remaining.size, dtype=bool)
            else:
                try:
                    conf = confidence(got[step.confidence])
                except KeyError:
                    raise ModelError(f"graph '{self.graph}' cascade '{step.name}': step "
                                     f"'{member.name}' returned no '{step.confidence}' (its "
                                     f"confidence); returned {sorted(got)}") from None
                sure = conf >= step.thresholds[i]
                if not sure.all() and env.skip_reason(members[i + 1]) is not None:
                    sure[:] = True  # the next member would not fit the budget: answer now
            if answer is None:
                answer = {k: np.zeros((self.rows, *v.shape[1:]), dtype=v.dtype)
                          for k, v in got.items()}
            picked = remaining[sure]
            for k, v in got.items():
                if k in answer:
                    answer[k][picked] = v[sure]
            answered_by[picked] = member.name
            remaining = remaining[~sure]
            if not remaining.size:
                break
        if answer is None:  # every member failed (the last one raised above)
            raise error or ModelError(f"cascade '{step.name}' answered nothing")
        answer[ANSWERED_BY] = answered_by
        return answer


async def _gather(tasks: list[asyncio.Future[None]]) -> None:
    """Wait for every step; the first failure cancels the others and is raised."""
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        raise


class Schedule:
    """How a graph's steps wait for each other: ``deps`` (each step's steps to await, a
    cascade's members standing for their cascade), ``chain``: whether each step reads the
    one before it and no other, so the steps run one after another without tasks,
    ``degrades``: whether an answer may be degraded (a fallback or a cascade), so it says why,
    ``plain``: no step can degrade and none is a cascade, so the steps can run in one loop
    (:meth:`GraphRun.answer_plain`), and each step's reads and the graph's outputs as
    ``(name, producer, output)`` (producer "": a graph input), parsed once."""

    def __init__(self, spec: DagSpec) -> None:
        from redline.models.dag.spec import dependencies

        members = spec.members()
        self.deps: dict[str, list[str]] = {
            name: list(dict.fromkeys(members.get(d, d)
                                     for d in dependencies(spec, spec.steps[name])))
            for name in spec.order}
        order = spec.order
        self.chain = all(self.deps[n] == [order[i - 1]] for i, n in enumerate(order) if i)
        self.degrades = spec.has_fallback
        self.plain = not self.degrades and all(
            spec.steps[n].kind in ("model", "python", "ensemble") for n in order)
        self.reads: dict[str, tuple[tuple[str, str, str], ...]] = {
            name: tuple((key, *split_ref(ref)) for key, ref in step.inputs.items())
            for name, step in spec.steps.items()}
        self.output_reads = tuple((name, *split_ref(ref)) for name, ref in spec.outputs.items())
