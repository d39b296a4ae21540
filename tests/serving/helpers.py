"""Tiny ONNX models built with onnx.helper, and a real server running on its own thread."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from redline.assembly import build_server
from redline.config import Settings
from redline.models import ModelRepository

V2_TO_ONNX = {
    "BOOL": TensorProto.BOOL, "INT8": TensorProto.INT8, "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32, "INT64": TensorProto.INT64, "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16, "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}
ALL_DATATYPES = list(V2_TO_ONNX)
T = TypeVar("T")


def _model(nodes, inputs, outputs, initializers=()) -> bytes:  # type: ignore[no-untyped-def]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def identity_model(datatype: str, width: int = 3) -> bytes:
    """``y = x`` for one V2 datatype: round-trips every value exactly."""
    t = V2_TO_ONNX[datatype]
    return _model([helper.make_node("Identity", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", t, [None, width])],
                  [helper.make_tensor_value_info("y", t, [None, width])])


def affine_model(width: int = 4, scale: float = 2.0, offset: float = 0.0) -> bytes:
    """``y = x * scale + offset`` and ``s = sum(x, axis=1)`` over FP32 rows (two outputs)."""
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["y"]),
        helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "k"),
             numpy_helper.from_array(np.array(offset, np.float32), "b"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, width]),
                   helper.make_tensor_value_info("s", TensorProto.FLOAT, [None])], inits)


def slow_model(width: int = 384, layers: int = 60) -> bytes:
    """``y == x``, but each run multiplies a width×width matrix ``layers`` times (tens of ms).

    The heavy branch depends on the input (an outer product), so ONNX Runtime cannot fold it
    away at load time; it costs about the same whatever the batch size.
    """
    w = numpy_helper.from_array(np.eye(width, dtype=np.float32), "w")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [helper.make_node("Transpose", ["x"], ["xt"]),
             helper.make_node("MatMul", ["xt", "x"], ["h0"])]
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [f"h{i}", "w"], [f"h{i + 1}"]))
    nodes += [helper.make_node("ReduceMean", [f"h{layers}"], ["m"], keepdims=0),
              helper.make_node("Mul", ["m", "zero"], ["z"]),
              helper.make_node("Add", ["x", "z"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, width])],
                  [w, zero])


class ServerThread:
    """A real RedlineServer (REST and gRPC on ephemeral ports) on its own thread and event loop:
    sync clients can call it from tests. The one test server of the suite."""

    def __init__(self, settings: Settings, repository: ModelRepository | None = None) -> None:
        settings.server.http_port = 0
        settings.server.grpc_port = 0
        self.settings = settings
        self.server = build_server(settings, repository)
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._started = threading.Event()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def serve() -> None:
            task = asyncio.ensure_future(self.server.serve(install_signals=False))
            started = asyncio.ensure_future(self.server.started.wait())
            await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
            self._started.set()
            await task

        try:
            self.loop.run_until_complete(serve())
        except BaseException as exc:  # noqa: BLE001 - surfaced to the test
            self.error = exc
            self._started.set()

    def start(self) -> ServerThread:
        # The server collects garbage at start-up (then freezes what is left), on its own
        # thread: what earlier tests left in reference cycles would be finalised there, and a
        # finaliser bound to its thread fails loudly (tritonclient's HTTP client under gevent:
        # "InvalidThreadUseError"). Collect it here, on the thread that made it.
        gc.collect()
        self._thread.start()
        if not self._started.wait(60) or self.error is not None:
            raise RuntimeError(f"server did not start: {self.error!r}")
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.server.stop)
        self._thread.join(30)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run a coroutine on the server's loop (e.g. ``registry.sync()``) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def make_repository(root: Path) -> ModelRepository:
    repo = ModelRepository(root)
    for datatype in ALL_DATATYPES:
        repo.add_onnx(f"id_{datatype.lower()}", identity_model(datatype), missing_values="allow")
    repo.add_onnx("affine", affine_model())
    repo.add_onnx("slow", slow_model())
    return repo


@contextmanager
def lend_sigalrm() -> Iterator[None]:
    """pytest-timeout keeps SIGALRM for itself, and the inline guard leaves another owner's
    signal alone: lend it to the guard for a test, then give it back."""
    from redline.serving import inline_guard

    before = signal.getsignal(signal.SIGALRM)
    timer = signal.getitimer(signal.ITIMER_REAL)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    inline_guard._installed = None  # noqa: SLF001
    try:
        yield
    finally:
        inline_guard.disarm()  # the guard leaves its last alarm pending: not for the next owner
        signal.signal(signal.SIGALRM, before)
        inline_guard._installed = None  # noqa: SLF001
        if timer[0]:
            signal.setitimer(signal.ITIMER_REAL, *timer)
