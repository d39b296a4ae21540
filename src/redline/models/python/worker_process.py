"""The worker process's side of ``workers.py``: load the model, then answer runs.

Each run's inputs are read in place from the server's shared-memory block; numeric outputs are
written to the worker's output block (reused run after run), anything else pickled. A worker
exits when its socket closes, and when the server's process is gone (it checks its parent once a
second).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

from redline.models.python.workers import FIRST_BYTES, Entry, layout


def _attach(name: str) -> SharedMemory:
    """Map a block the server made. Before Python 3.13 attaching also registers the block with
    this process's resource tracker, which would unlink it when the worker exits: the server
    made it, and frees it."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    register = resource_tracker.register
    resource_tracker.register = lambda *args: None  # type: ignore[assignment]
    try:
        return SharedMemory(name=name)
    finally:
        resource_tracker.register = register  # type: ignore[assignment]


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)  # the server is gone: nothing will read this worker's answers


def _answer(outputs: Any, outbox: SharedMemory) -> tuple[Any, int]:
    """The reply for ``outputs``: numeric arrays written to ``outbox``, anything else pickled;
    with the size the block must grow to when they did not fit (all pickled then)."""
    if not isinstance(outputs, dict):
        return outputs, 0
    arrays = {k: v for k, v in outputs.items()
              if type(v) is np.ndarray and v.dtype.kind not in "OUSV"}
    offsets, needed = layout(arrays)
    fits = needed <= outbox.size
    entries: list[Entry] = []
    for name, value in outputs.items():
        if fits and name in offsets:
            view: np.ndarray = np.ndarray(value.shape, value.dtype, outbox.buf, offsets[name])
            view[...] = value
            del view
            entries.append(("a", name, value.dtype.str, value.shape, offsets[name]))
        else:
            entries.append(("o", name, value))
    return entries, 0 if fits else max(needed * 2, FIRST_BYTES)


def main(argv: list[str]) -> None:
    """A worker: load the model, say ready, then answer runs until the socket closes."""
    from redline.errors import InvalidInput, ModelError
    from redline.models.python.code import (
        ENTRY_FILE,
        declared_signature,
        describe_failure,
        instantiate,
        user_traceback,
        where,
    )

    fd, folder = int(argv[0]), Path(argv[1])
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    conn = Connection(fd)
    conn.send(("started",))
    try:
        model, _module = instantiate(folder)
        cls = type(model)
        declared = declared_signature(cls, str(folder / ENTRY_FILE))
    except ModelError as exc:
        conn.send(("failed", exc.message, exc.details.get("traceback", "")))
        return
    except InvalidInput as exc:
        conn.send(("invalid", exc.message))
        return
    conn.send(("ready", {"class": cls.__name__, "signature": None if declared is None else [
        [s.to_dict() for s in declared[0]], [s.to_dict() for s in declared[1]]]}))
    blocks: dict[str, SharedMemory] = {}

    def block(name: str | None, kind: str) -> SharedMemory | None:
        current = blocks.get(kind)
        if name is None or (current is not None and current.name == name):
            return current
        if current is not None:
            try:
                current.close()
            except BufferError:
                pass
        blocks[kind] = _attach(name)
        return blocks[kind]

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        _, in_name, out_name, entries = message
        inbox = block(in_name, "in")
        outbox = block(out_name, "out")
        assert outbox is not None
        inputs: dict[str, Any] = {}
        for entry in entries:
            if entry[0] == "a":
                _, name, dtype, shape, offset = entry
                assert inbox is not None
                inputs[name] = np.ndarray(shape, np.dtype(dtype), inbox.buf, offset)
            else:
                inputs[entry[1]] = entry[2]
        try:
            outputs = model.predict(inputs)
        except Exception as exc:  # noqa: BLE001 - the user's predict may raise anything
            key = f"{type(exc).__name__}{where(exc, folder)}"
            reply: Any = ("raised", describe_failure(exc, folder),
                          user_traceback(exc, folder), key)
        else:
            reply = ("ok", *_answer(outputs, outbox))
        del inputs
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(("unsendable", f"predict returned something that cannot be sent back "
                                     f"to the server ({exc}); return numpy arrays"))
