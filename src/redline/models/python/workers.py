"""Worker processes that run a Python model's ``predict``, tensors passed in shared memory.

Two users: ``runtime: process`` (a model whose Python holds the GIL runs beside the server's
event loop, not on it) and ``models add``, which runs the sample in a worker so that a
``model.py`` that hangs or crashes cannot take the command down with it.

Each worker has two shared-memory blocks that the server makes and owns: its inputs, written
by the server and read in place by ``predict`` (no copy on the worker's side), and its outputs,
written by the worker and copied out by the server (the block is reused by the next run). A
block that is too small is replaced by a larger one, named in the next message. Control messages
(which tensor is where) go over a socket pair as small pickles.

Workers are started with ``python -m`` (``_worker.py``) rather than ``multiprocessing``:
spawning through multiprocessing re-imports the caller's ``__main__``, which fails in a script
that adds a model without an ``if __name__ == "__main__"`` guard. This module is the server's
side; the worker's is ``worker_process.py``.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("redline.models")
_ALIGN = 64
STARTUP_S = 120.0  # a worker process imports Python, numpy and redline within this
FIRST_BYTES = 1 << 20
Entry = tuple[Any, ...]


class WorkerFailed(Exception):
    """The worker could not run a call: ``predict`` raised (``traceback`` set), the worker died
    or did not answer in time (``lost``: it was stopped, and is replaced)."""

    def __init__(self, message: str, traceback: str = "", key: str = "",
                 lost: bool = False, closing: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.traceback = traceback
        self.key = key or message
        self.lost = lost
        self.closing = closing  # the pool is closing: no failure of the model's


class WorkerStartFailed(Exception):
    """A worker could not import or load the model; ``invalid``: its signature is malformed."""

    def __init__(self, message: str, traceback: str = "", invalid: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.traceback = traceback
        self.invalid = invalid


# ---------------------------------------------------------------------- the server's side
class _Worker:
    """One worker process, its socket and its two shared-memory blocks."""

    def __init__(self, folder: Path, label: str) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])  # the folder that holds `redline`
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "redline.models.python._worker", str(theirs.fileno()),
             str(folder), label],
            pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.inbox: SharedMemory | None = None
        self.outbox = SharedMemory(create=True, size=FIRST_BYTES)
        self._sent_out: str | None = None
        self.thread: int | None = None  # the server thread running a call on it, if any
        self.info: dict[str, Any] = {}
        self._closing = threading.Lock()
        self._closed = False

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """The worker's answer once it has loaded the model: its class and declared signature.
        ``timeout_s`` counts from when the worker has started (Python and redline imported):
        it is the model's own time to import and load."""
        started = self._receive(STARTUP_S, "to start Python")
        if started[0] != "started":
            raise WorkerStartFailed(f"the worker process answered {started[0]!r} at start")
        reply = self._receive(timeout_s, "to import and load the model")
        if reply[0] == "ready":
            self.info = reply[1]
            return self.info
        raise WorkerStartFailed(reply[1], reply[2] if len(reply) > 2 else "",
                                invalid=reply[0] == "invalid")

    def run(self, inputs: dict[str, np.ndarray], timeout_s: float | None) -> dict[str, Any]:
        entries: list[Entry] = []
        offsets, needed = layout(inputs)
        if needed and (self.inbox is None or self.inbox.size < needed):
            self._replace_inbox(max(needed * 2, FIRST_BYTES))
        for name, array in inputs.items():
            where = offsets.get(name)
            if where is None:
                entries.append(("o", name, array))
                continue
            view: np.ndarray = np.ndarray(array.shape, array.dtype, self.inbox.buf,  # type: ignore[union-attr]
                                          where)
            view[...] = array
            entries.append(("a", name, array.dtype.str, array.shape, where))
            del view
        out_name = self.outbox.name if self._sent_out != self.outbox.name else None
        try:
            self.conn.send(("run", self.inbox.name if self.inbox else None, out_name, entries))
        except (OSError, ValueError):  # the worker died, or the pool closed it
            raise WorkerFailed("the model's worker process is gone", lost=True) from None
        self._sent_out = self.outbox.name
        reply = self._receive(timeout_s, "to answer")
        if reply[0] == "raised":
            raise WorkerFailed(reply[1], traceback=reply[2], key=reply[3])
        if reply[0] != "ok":
            raise WorkerFailed(reply[1])
        _, answer, grow = reply
        outputs = self._unpack(answer)
        if grow:
            old, self.outbox = self.outbox, SharedMemory(create=True, size=grow)
            _release(old)
        return outputs

    def _unpack(self, answer: Any) -> Any:
        if not isinstance(answer, list):
            return answer  # not a dict: the signature check names what it is
        outputs: dict[str, Any] = {}
        for entry in answer:
            if entry[0] == "a":
                _, name, dtype, shape, offset = entry
                view: np.ndarray = np.ndarray(shape, np.dtype(dtype), self.outbox.buf, offset)
                outputs[name] = view.copy()  # the block is reused by the next run
                del view
            else:
                outputs[entry[1]] = entry[2]
        return outputs

    def _replace_inbox(self, size: int) -> None:
        old, self.inbox = self.inbox, SharedMemory(create=True, size=size)
        if old is not None:
            _release(old)

    def _receive(self, timeout_s: float | None, doing: str) -> Any:
        try:
            if timeout_s is not None and not self.conn.poll(timeout_s):
                self.kill()
                raise WorkerFailed(f"predict did not finish within {timeout_s:g} s (the worker "
                                   "was stopped)" if doing == "to answer" else
                                   f"the worker took longer than {timeout_s:g} s {doing}",
                                   lost=True)
            return self.conn.recv()
        except (EOFError, OSError):
            code = self.process.poll()
            if code is None:
                self.kill()
                code = self.process.returncode
            how = (f"was killed by signal {-code}" if code is not None and code < 0
                   else f"exited with code {code}")
            raise WorkerFailed(f"the model's worker process {how} while running it",
                               lost=True) from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Stop the worker and free its blocks (once)."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        if self.process.poll() is None:
            try:
                self.conn.send(("stop",))
                self.process.wait(2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self.conn.close()
        for block in (self.inbox, self.outbox):
            if block is not None:
                _release(block)
        self.inbox = None


def layout(inputs: dict[str, np.ndarray]) -> tuple[dict[str, int], int]:
    """Offsets in the inputs block for every array of plain numbers (objects go by pickle)."""
    offsets: dict[str, int] = {}
    end = 0
    for name, array in inputs.items():
        if array.dtype.kind in "OUSV":
            continue
        offsets[name] = end
        end += -(-array.nbytes // _ALIGN) * _ALIGN
    return offsets, end


def _release(block: SharedMemory) -> None:
    try:
        block.close()
    except BufferError:  # a view is still alive somewhere: the mapping goes with it
        pass
    try:
        block.unlink()
    except FileNotFoundError:
        pass


class WorkerPool:
    """``count`` workers of one model; ``predict`` takes an idle one, and (with ``replace``)
    replaces one that died, hung past ``timeout_s`` or was abandoned."""

    def __init__(self, folder: Path, count: int, label: str, start_timeout_s: float,
                 replace: bool = True) -> None:
        self.folder = folder
        self.replace = replace
        self.label = label
        self.start_timeout_s = start_timeout_s
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._starting = 0  # replacements being started
        started = [_Worker(folder, label) for _ in range(max(1, count))]
        try:
            for worker in started:
                self.info = worker.wait_ready(start_timeout_s)
        except BaseException:
            for worker in started:
                worker.close()
            raise
        for worker in started:
            self._workers.add(worker)
            self._idle.put(worker)

    def predict(self, inputs: dict[str, np.ndarray], timeout_s: float | None = None) -> Any:
        worker = self._take()
        worker.thread = threading.get_ident()
        try:
            outputs = worker.run(inputs, timeout_s)
        except WorkerFailed as exc:
            if not exc.lost:
                worker.thread = None
                self._idle.put(worker)
                raise
            self._replace_soon(worker)
            raise
        except BaseException:
            self._replace_soon(worker)  # a half-done exchange leaves the socket out of step
            raise
        worker.thread = None
        self._idle.put(worker)
        return outputs

    def _take(self) -> _Worker:
        while True:
            with self._lock:
                if self._closed:
                    raise WorkerFailed("the model is unloading", lost=True, closing=True)
                if not (self._workers or self._starting):
                    raise WorkerFailed("the model has no worker process left (each failed to "
                                       "start again; see the log)", lost=True)
            try:
                return self._idle.get(timeout=1.0)
            except queue.Empty:
                continue

    def _replace_soon(self, worker: _Worker) -> None:
        """Replace ``worker`` on a thread of its own: the failed call answers at once, and the
        other workers serve while the new one loads the model."""
        with self._lock:
            self._workers.discard(worker)
            replace = self.replace and not self._closed
            if replace:
                self._starting += 1
        if not replace:
            worker.close()
            return
        threading.Thread(target=self._replace, args=(worker,), daemon=True,
                         name=f"replace-{self.label}").start()

    def _replace(self, worker: _Worker) -> None:
        """Stop ``worker`` and start one in its place."""
        try:
            self._start_in_place_of(worker)
        finally:
            with self._lock:
                self._starting -= 1

    def _start_in_place_of(self, worker: _Worker) -> None:
        worker.close()
        with self._lock:
            if self._closed:
                return
        try:
            fresh = _Worker(self.folder, self.label)
        except OSError as exc:
            if not self._closed:
                log.error("%s: cannot start a worker process in place of one that stopped: %s",
                          self.label, exc)
            return
        try:
            fresh.wait_ready(self.start_timeout_s)
        except (WorkerStartFailed, WorkerFailed, OSError) as exc:
            fresh.close()
            if not self._closed:
                log.error("%s: a worker process started in place of one that stopped failed: "
                          "%s", self.label, getattr(exc, "message", exc))
            return
        with self._lock:
            if self._closed:
                fresh.close()
                return
            self._workers.add(fresh)
        self._idle.put(fresh)

    def abandon(self, thread_id: int) -> None:
        """Stop the worker that server thread ``thread_id`` waits on; the thread's call then
        fails and the worker is replaced."""
        with self._lock:
            running = [w for w in self._workers if w.thread == thread_id]
        for worker in running:
            worker.process.kill()  # only the signal: the waiting thread replaces it

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers)
            self._workers.clear()
        for worker in workers:
            worker.close()

    @property
    def size(self) -> int:
        with self._lock:
            return len(self._workers)
