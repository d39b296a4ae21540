"""One loaded, warm model version, and the API other packages use to run it.

``ModelHandle.infer`` is the one entry point to a model from inside the server: the V2 REST and
gRPC handlers use it, and so can other request handlers mounted on the app (entity predictions
under ``/v1``)::

    handle = registry.get("fraud")                  # default version; or get("fraud", "3")
    outputs = await handle.infer({"input": x}, deadline_from_ms(20))   # or a request's Budget
    # x: numpy array, first dimension = rows; outputs: output name -> numpy array, same rows

``infer`` validates the inputs (names, dtypes, shapes, NaN policy; raises ``InvalidInput``),
applies admission (``Overloaded``), queues them in the version's batcher (where they may share a
run with other requests), and resolves to this request's rows of every output. A request keeps
the handle it started on, so a hot swap never changes the version under it.
"""

from __future__ import annotations

import copy
import math
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from redline.config import Settings
from redline.errors import InvalidInput, RedlineError
from redline.models.datatypes import V2_TO_NUMPY
from redline.models.runner import ModelRunner
from redline.serving.batcher import Batcher
from redline.serving.deadline import LOW, AdmissionStats, Budget, CostModel, now
from redline.serving.fastjson import JsonFastPath
from redline.serving.inline_guard import InlineGuard
from redline.serving.stages import INFERENCE, QUEUE, RequestRecord, perf_ns

# The finiteness check below multiplies NaN by 0 on purpose; numpy's warning about it is noise.
warnings.filterwarnings("ignore", "invalid value encountered in dot", RuntimeWarning,
                        module=__name__)


class ModelHandle:
    """A model version ready to serve: its session, batcher, worker thread and counters.

    ``session`` is any ``ModelRunner``: ONNX Runtime's session or a Python model's; the runner
    says how many worker threads it needs and whether its runs may leave the event loop's
    thread (``user_code``), and everything else is the same for both."""

    # Whether the request-path warm-up (``serving/warmup.py``) sends this version requests.
    warm_requests = True
    # Whether a request times stages of its own on its record while it runs (a graph's steps):
    # an edge that observes then makes the record before ``infer_now``, not after.
    steps_on_record = False
    # A graph's steps as stages (``step:<name>``) in its order, and each one's column in the
    # flat row a common request leaves (``stages.graph_times``); none for a model.
    step_stages: tuple[str, ...] = ()
    step_columns: dict[str, int] = {}  # noqa: RUF012 - read-only, replaced per graph

    def __init__(self, session: ModelRunner, settings: Settings) -> None:
        self.session = session
        self.metadata = session.metadata
        self.name = self.metadata.name
        self.version = int(self.metadata.version)
        self.version_str = str(self.version)
        self.key = (self.name, self.version_str)  # names the version in metrics and series
        model_settings = settings.for_model(self.name)
        self.slo_ms = model_settings.slo_ms or settings.server.default_slo_ms
        # The cheaper model /v1 falls back to: redline.yaml's models.<name>.fallback when set,
        # else the one recorded in the model's metadata (`redline optimize --as-fallback`).
        # Read here once; nothing else reads either source.
        self.fallback: str | None = model_settings.fallback or self.metadata.fallback
        self.input_specs = {t.name: t for t in session.inputs}
        self.output_names = [t.name for t in session.outputs]
        batchable = all(t.shape and t.shape[0] == -1 for t in session.inputs) and all(
            t.shape and t.shape[0] == -1 for t in session.outputs
        )
        self.stats = AdmissionStats()
        self.cost = CostModel()
        self._executor = ThreadPoolExecutor(
            session.worker_threads, thread_name_prefix=f"run-{self.name}-{self.version}")
        self.batcher = Batcher(
            # The public run: ONNX Runtime's compiled ``_sess.run`` skips the Python-side
            # checks but saves well under 1% of a one-row request's server CPU (the demo
            # forest, with a reused RunOptions): not worth a private attribute.
            session.run,
            settings.batching_for(self.name),
            executor=self._executor,
            batchable=batchable,
            slo_s=self.slo_ms / 1000.0,
            cost=self.cost,
            stats=self.stats,
            name=f"{self.name}:{self.version}",
            **self._run_options(session),
        )
        self._runtime = settings.runtime
        # Keep requests' inputs and outputs on their records. Monitoring's drift, quality and
        # review windows take at most `monitoring.window_rows_per_s` a second, so only that many
        # records (spread in time) carry their arrays, plus every request with an id (a label
        # may join it): holding every request's arrays until the monitor's tick freed them cost
        # CPU on every request (benchmarks/serving/ab_cpu.py). A rollout judges every request
        # of the versions it compares, and a shadow replays them: it calls `keep_every_request`
        # while it runs.
        self.keep_io = settings.monitoring.enabled
        self.shadowed = False
        rows_per_s = float(settings.monitoring.window_rows_per_s or 0)
        self._io_gap_ns = int(1e9 / rows_per_s) if rows_per_s > 0 else 0
        self.io_next_ns = 0  # the next request at or after this perf_ns time is sampled
        self._input_names = set(self.input_specs)
        self._output_set = set(self.output_names)
        self._reject_nan = self.metadata.missing_values != "allow"
        self._zeros: dict[np.dtype, np.ndarray] = {}
        # REST JSON requests of the common shape skip the general decoder and checks (fastjson).
        self.json_fast = JsonFastPath.for_model(
            session.inputs, session.outputs, self.name, self.version_str, self._reject_nan
        )
        self._fast_specs: dict[str, tuple[np.dtype, tuple[int, ...] | None, bool]] = {}
        for spec in session.inputs:
            fixed = all(d >= 0 for d in spec.shape[1:])
            self._fast_specs[spec.name] = (
                V2_TO_NUMPY[spec.datatype],
                tuple(spec.shape[1:]) if fixed and spec.shape else None,
                bool(spec.shape) and spec.shape[0] == -1,
            )

    def _run_options(self, session: ModelRunner) -> dict[str, Any]:
        """How the batcher runs this engine: user code on the loop only under a guard (one per
        batcher: a twin's stopped runs are its own), cut at its requests' deadlines."""
        if not session.user_code:
            return {"inline": session.inline_ok}
        guard = InlineGuard(f"{self.name}:{self.version}") if session.inline_ok else None
        return {"inline": session.inline_ok, "guard": guard, "cut_late": True,
                "max_running": session.concurrent_runs, "abandon": session.abandon}

    def warm(self) -> None:
        """Run every warm-up batch size, then seed the cost model from timed runs.

        The runs happen on this version's own worker thread, where batches run: ONNX Runtime's
        first run on a thread costs milliseconds more than later ones (its per-thread state;
        ``benchmarks/first_request``), which the first batch would otherwise pay. (The first
        inline run on the event loop's thread is paid by the request-path warm-up,
        ``serving/warmup.py``.)"""
        self._executor.submit(self._warm_runs).result()

    def _warm_runs(self) -> None:
        sizes = sorted(set(self._runtime.warmup_batch_sizes + [1, self.batcher.max_batch]))
        self.session.warmup(sizes if self.batcher.batchable else [1])
        t1 = self._time_run(1)
        n = self.batcher.max_batch
        tn = self._time_run(n) if n > 1 else t1
        self.cost.seed(t1, tn, n)

    def _time_run(self, rows: int, repeats: int = 3) -> float:
        example = self.session.example_inputs(rows)
        best = float("inf")
        for _ in range(repeats):
            t0 = now()
            self.session.run(example)
            best = min(best, now() - t0)
        return best

    def twin(self) -> ModelHandle:
        """A stand-in for the request-path warm-up (``serving/warmup.py``): the same session,
        decoders and worker thread, so their first-time costs are paid through it, but its own
        batcher, counters, cost model and monitoring sample clock, so nothing a request through
        it does is seen in this version's stats or metrics."""
        twin = copy.copy(self)  # a new __dict__: plain attributes set on the twin stay its own
        twin.stats = AdmissionStats()
        twin.cost = copy.copy(self.cost)
        old = self.batcher
        twin.batcher = Batcher(self.session.run, old.settings, executor=self._executor,
                               batchable=old.batchable, slo_s=old.slo_s, cost=twin.cost,
                               stats=twin.stats, name=old.name,
                               **self._run_options(self.session))
        return twin

    # ------------------------------------------------------------------ requests
    def prepare(
        self, inputs: dict[str, np.ndarray], datatypes: dict[str, str] | None = None
    ) -> tuple[dict[str, np.ndarray], int]:
        """Validated inputs and their row count. Declared datatypes must match the model's."""
        if datatypes is not None:
            for name, datatype in datatypes.items():
                spec = self.input_specs.get(name)
                if spec is not None and spec.datatype != datatype:
                    raise InvalidInput(
                        f"input '{name}' is declared {datatype} but model '{self.name}' expects "
                        f"{spec.datatype}; send {spec.datatype} data"
                    )
        rows = self._fast_check(inputs)
        if rows >= 0:
            return inputs, rows
        checked = self.session.validate(inputs)
        first = next(iter(checked.values()))
        rows = int(first.shape[0]) if first.ndim else 1
        return checked, rows

    def _fast_check(self, inputs: dict[str, np.ndarray]) -> int:
        """Rows, when every input already has the model's exact dtype and shape and is finite;
        -1 sends the request through ``session.validate``, which casts or says what is wrong.

        Why: at one row per request the general validator costs as much as the model run;
        well-formed requests (nearly all) need only these comparisons.
        """
        if inputs.keys() != self._input_names:
            return -1
        rows = -1
        for name, array in inputs.items():
            dtype, trailing, batched = self._fast_specs[name]
            if array.dtype != dtype or array.shape[1:] != trailing or array.ndim == 0:
                return -1
            if batched:
                if rows not in (-1, array.shape[0]):
                    return -1
                rows = array.shape[0]
            if self._reject_nan and dtype.kind == "f":
                # x·0 is 0 for every finite x and NaN for NaN or ±inf, so the dot product with
                # zeros is finite exactly when the input is (it cannot overflow). A dot is the
                # cheapest full scan numpy offers: a third of ``sum()`` at one row.
                flat = array.ravel()
                zeros = self._zeros.get(dtype)
                if zeros is None or zeros.size < flat.size:
                    zeros = self._zeros[dtype] = np.zeros(max(flat.size, 4096), dtype)
                if not math.isfinite(flat.dot(zeros[: flat.size])):
                    return -1
        return rows if rows >= 0 else 1

    async def infer(
        self,
        inputs: dict[str, np.ndarray],
        budget: Budget | float | None = None,
        *,
        priority: int = LOW,
        datatypes: dict[str, str] | None = None,
        validate: bool = True,
        record: RequestRecord | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``inputs`` through this version (batched with others); see the module doc.

        ``budget`` is the request's :class:`Budget` (or an absolute deadline, or ``None``: no
        deadline). The run-now-or-queue decision is made here and nowhere else. With a
        ``record``, the queue and inference stages are timed on it.
        """
        deadline = budget.deadline if isinstance(budget, Budget) else budget
        if validate:
            inputs, rows = self.prepare(inputs, datatypes)
        else:
            first = next(iter(inputs.values()))
            rows = int(first.shape[0]) if first.ndim else 1
        outputs = self.infer_now(inputs, rows, record, deadline)
        if outputs is None:
            outputs = await self.infer_queued(inputs, rows, deadline, priority, record)
        return outputs

    def infer_now(self, inputs: dict[str, np.ndarray], rows: int,
                  record: RequestRecord | None = None,
                  deadline: float | None = None) -> dict[str, np.ndarray] | None:
        """The outputs of checked ``inputs`` run at once on the calling thread (the batcher is
        idle and the run is short), else ``None``: then :meth:`infer_queued` queues them.
        (A model's run at once is short, within any budget; a graph reads ``deadline`` for
        its steps.)

        Synchronous, so the HTTP protocol can answer a request from its parser callback without
        a task (``serving/http_protocol.py``); :meth:`infer` is both steps in one call.
        """
        if record is None:
            return self.batcher.run_now(inputs, rows)
        t0 = perf_ns()
        outputs = self.batcher.run_now(inputs, rows)
        if outputs is not None:
            record.spans.append((INFERENCE, t0, perf_ns()))  # record.add, one call less
            self.keep_io_on(record, inputs, outputs, t0)
        return outputs

    async def infer_queued(
        self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None,
        priority: int = LOW, record: RequestRecord | None = None,
    ) -> dict[str, np.ndarray]:
        """Checked ``inputs`` through the batcher's queue (admission, deadline, batching)."""
        if record is None:
            return await self.batcher.submit(inputs, rows, deadline, priority)
        t0 = perf_ns()
        batcher = self.batcher
        try:
            outputs = await batcher.submit(inputs, rows, deadline, priority)
        except RedlineError:
            record.add(QUEUE, t0, perf_ns())  # shed or expired in the queue: it never ran
            raise
        t1 = perf_ns()
        # The batch that resumed this request ran last_run_s; the rest of the wait was queue.
        ran = max(t0, t1 - int(batcher.last_run_s * 1e9))
        record.add(QUEUE, t0, ran)
        record.add(INFERENCE, ran, t1)
        self.keep_io_on(record, inputs, outputs, t0)
        return outputs

    def keep_every_request(self, on: bool) -> None:
        """Keep every request's arrays (a rollout judging this version, a shadow replaying it),
        not only monitoring's sample; off again when the rollout ends."""
        self.shadowed = on

    def keep_io_on(self, record: RequestRecord, inputs: dict[str, np.ndarray],
                 outputs: dict[str, np.ndarray], t0: int) -> None:
        """Keep the arrays on the record when monitoring's windows (or a shadow) want them."""
        if self.shadowed:
            record.inputs, record.outputs = inputs, outputs
        elif self.keep_io:
            if not self.sample_due(t0) and not record.request_id:
                return  # (with an id a label may come: the quality join wants it)
            record.inputs, record.outputs = inputs, outputs

    def sample_due(self, t0: int) -> bool:
        """Whether a request that ran at ``t0`` is the monitoring windows' next sample, at
        their own rate (the next one is then due a gap later)."""
        if t0 >= self.io_next_ns:
            self.io_next_ns = t0 + self._io_gap_ns
            return True
        return False

    def check_outputs(self, names: list[str]) -> None:
        """Refuse unknown requested output names before any work is done."""
        for name in names:
            if name not in self._output_set:
                raise InvalidInput(
                    f"model '{self.name}' has no output {name!r}; outputs: {self.output_names}"
                )

    def select_outputs(
        self, outputs: dict[str, np.ndarray], names: list[str] | None
    ) -> dict[str, np.ndarray]:
        """The requested outputs only, in the order asked; unknown names are a user error."""
        if not names:
            return outputs
        try:
            return {n: outputs[n] for n in names}
        except KeyError as exc:
            raise InvalidInput(
                f"model '{self.name}' has no output {exc.args[0]!r}; "
                f"outputs: {self.output_names}"
            ) from None

    # ------------------------------------------------------------------ lifecycle
    async def retire(self, timeout_s: float) -> None:
        """Finish queued and running requests, then release the worker thread and what the
        runner holds (a Python model's worker processes)."""
        await self.batcher.drain(timeout_s)
        self._executor.shutdown(wait=False)
        self.session.close()
