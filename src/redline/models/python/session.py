"""``PythonSession``: a ``model.py`` version behind the same interface as ONNX Runtime's session.

The server's handle, batcher, warm-up and edges call ``run`` on it exactly as on an
``InferenceSession``: batched rows in, outputs by name out. ``run`` calls ``predict`` (in this
process by default; in worker processes with ``runtime: process``), then holds the answer to the
declared signature. Anything that goes wrong is a ``ModelError`` (HTTP 500, code
``model_error``) with the model's own message and line; the traceback is logged once per distinct
failure, and repeats at most once a minute with their count, so a model failing on every request
cannot flood the log.

Why in-process by default: a Python model that does little costs a request almost nothing
beyond the ONNX path only without a process hop. Because ``predict`` may hold the GIL or hang
(``user_code``), the server runs it on the event loop only under a guard that stops it after a
couple of milliseconds (``serving/inline_guard.py``), else on worker threads.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from redline.config import RuntimeSettings
from redline.errors import ConfigError, CorruptModel, ModelError, ModelNotReady
from redline.models.metadata import ModelMetadata
from redline.models.python.code import (
    ENTRY_FILE,
    describe_failure,
    forget,
    instantiate,
    user_traceback,
    where,
)
from redline.models.python.contract import BrokenSignature, OutputCheck
from redline.models.python.workers import WorkerFailed, WorkerPool
from redline.models.runner import ModelRunner

log = logging.getLogger("redline.models")

SAMPLE_FILE = "sample.npz"  # the rows `models add --sample` ran: warm-up runs them again
RUNTIMES = ("thread", "process")
THREADS = 4  # in-process: one runs; the others take over from runs abandoned past their budget
PROCESSES = 2  # runtime: process, when the settings name no number of workers
START_TIMEOUT_S = 300.0  # a worker process imports and loads the model within this
LOG_INTERVAL_S = 60.0


class FailureLog:
    """Each distinct failure of a model logged once with its traceback; repeats, and failures
    beyond the first ``max_kinds`` kinds, at most one line per ``interval_s`` with their count."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, max_kinds: int = 64) -> None:
        self.interval_s = interval_s
        self.max_kinds = max_kinds
        self._seen: set[str] = set()
        self._since = 0
        self._last = -float("inf")
        self._lock = threading.Lock()

    def __call__(self, key: str, message: str, traceback: str = "") -> None:
        t = time.monotonic()
        with self._lock:
            first = key not in self._seen and len(self._seen) < self.max_kinds
            if first:
                self._seen.add(key)
            else:
                self._since += 1
                if t - self._last < self.interval_s:
                    return
            count, self._since, self._last = self._since, 0, t
        if first:
            log.error("%s\n%s", message, traceback) if traceback else log.error("%s", message)
        else:
            log.error("%s (%d failure(s) of this model since the last one logged; the "
                      "traceback of each kind is logged once)", message, count)


class PythonSession(ModelRunner):
    """A loaded ``model.py`` version, run in this process (threads) or in worker processes."""

    user_code = True
    platform = backend = "python"  # as Triton names its Python backend

    def __init__(
        self,
        metadata: ModelMetadata,
        folder: str | Path,
        settings: RuntimeSettings | None = None,
        *,
        runtime: str = "thread",
        workers: int | None = None,
    ) -> None:
        super().__init__(metadata, settings)
        if runtime not in RUNTIMES:
            raise ConfigError(f"runtime of a Python model must be one of {list(RUNTIMES)}, "
                              f"got {runtime!r}")
        self.folder = Path(folder)
        self.runtime = runtime
        self.label = f"model '{metadata.name}' version {metadata.version}"
        self.log_failure = FailureLog()
        self._check = OutputCheck(metadata.outputs)
        self._sample = read_sample(self.folder, [s.name for s in self.inputs])
        self._pool: WorkerPool | None = None
        self._module: Any = None
        if runtime == "process":
            count = workers or PROCESSES
            self._pool = WorkerPool(self.folder, count, self.label, START_TIMEOUT_S)
            self._call: Any = self._pool.predict
            self.inline_ok = False  # a round trip to a process is never short
            # every worker may run a batch; spare threads replace workers that were stopped
            self.concurrent_runs = count
            self.worker_threads = count + 2
        else:
            try:
                model, self._module = instantiate(self.folder)
            except ModelError as exc:
                raise ModelError(f"{self.label}: {exc.message}", **exc.details) from None
            self._call = model.predict
            self.worker_threads = workers or THREADS

    @classmethod
    def load(cls, metadata: ModelMetadata, folder: Path, settings: RuntimeSettings | None = None,
             *, runtime: str | None = None, workers: int | None = None) -> PythonSession:
        """Check the version's files against the sha256 recorded at ``add``, then load it;
        ``runtime``/``workers`` unset take what the version recorded, else in-process."""
        verify_files(metadata, folder)
        recorded = python_info(metadata)
        return cls(metadata, folder, settings,
                   runtime=runtime or recorded.get("runtime") or "thread",
                   workers=workers or recorded.get("workers"))

    # ------------------------------------------------------------------ hot path
    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """``predict`` on already-validated rows; its answer checked against the signature."""
        rows = next(iter(inputs.values())).shape[0]
        try:
            outputs = self._call(inputs)
        except WorkerFailed as exc:
            if exc.closing:
                raise ModelNotReady(f"{self.label} is unloading; retry to reach its "
                                    "successor") from None
            reason = exc.message if exc.lost else f"predict raised {exc.message}"
            raise self._failed(exc.key, reason, exc.traceback) from None
        except Exception as exc:  # noqa: BLE001 - the user's predict may raise anything
            raise self._failed(f"{type(exc).__name__}{where(exc, self.folder)}",
                               f"predict raised {describe_failure(exc, self.folder)}",
                               user_traceback(exc, self.folder)) from None
        try:
            checked = self._check(outputs, rows)
        except BrokenSignature as exc:
            raise self._failed(exc.key, f"{ENTRY_FILE} broke its signature: {exc}") from None
        if output_names:
            return {n: checked[n] for n in output_names}
        return checked

    def _failed(self, key: str, reason: str, traceback: str = "") -> ModelError:
        message = f"{self.label}: {reason}"
        self.log_failure(key, message, traceback)
        return ModelError(message, model=self.metadata.name)

    # ------------------------------------------------------------------ lifecycle
    def example_inputs(self, batch_size: int) -> dict[str, np.ndarray]:
        """The rows ``models add`` ran, repeated to ``batch_size``: a model's own warm-up input
        (zeros may be no valid input for it)."""
        if self._sample is None:
            return super().example_inputs(batch_size)
        return {name: array[np.arange(batch_size) % len(array)]
                for name, array in self._sample.items()}

    @property
    def providers(self) -> list[str]:
        return [f"python ({self.runtime})"]

    def abandon(self, thread_id: int) -> None:
        if self._pool is not None:
            self._pool.abandon(thread_id)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._module is not None:
            forget(self._module)
            self._module = None


def python_info(metadata: ModelMetadata) -> dict[str, Any]:
    """What ``models add`` recorded about a Python version (``metadata.extra["python"]``)."""
    info = metadata.extra.get("python") if isinstance(metadata.extra, dict) else None
    return info if isinstance(info, dict) else {}


def verify_files(metadata: ModelMetadata, folder: Path) -> None:
    """Every file recorded at ``add`` is there with its sha256: a changed ``model.py`` (or
    weights file) is refused rather than run."""
    files = python_info(metadata).get("files") or {ENTRY_FILE: metadata.sha256}
    for name, expected in sorted(files.items()):
        path = folder / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CorruptModel(f"model file {path} cannot be read ({exc.strerror}); add the "
                               "model again") from exc
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise CorruptModel(
                f"model file {path} does not match its recorded sha256 (expected "
                f"{expected[:12]}…, found {actual[:12]}…): it was modified or damaged after it "
                "was added; add the model again")


def read_sample(folder: Path, names: list[str]) -> dict[str, np.ndarray] | None:
    """The version's sample rows by input name, or None when it has none."""
    path = folder / SAMPLE_FILE
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        if not set(names) <= set(data.files):
            return None
        sample = {n: data[n].astype(object) if data[n].dtype.kind in "US" else data[n]
                  for n in names}
    if any(len(a) == 0 for a in sample.values()):
        return None
    return sample
