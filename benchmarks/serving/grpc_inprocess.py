"""CPU time of one V2 gRPC ``ModelInfer`` in one process: redline's servicer against the bare floor.

Why: served, a gRPC request's CPU swings with the machine, and grpc.aio's own work (several
times the handler's) hides the handler's share. Here the servicer's ``ModelInfer`` is called
directly with a stub context (no sockets, no completion queue), after the service's own
deserializer, and its answer serialized as the service does; beside it the bare grpc.aio peer's
handler (the gRPC floor's shape: decode, run, raw outputs) on the same model. Rounds
alternate; the median process CPU time a call is reported for typed ``fp32_contents`` requests
(what the peers' load generator sends) and ``raw_input_contents`` (what ``redline bench``
sends), for redline with monitoring on (as ``redline serve`` runs) and off. Another tree:
run it with that tree's ``src`` first on ``PYTHONPATH``.

    PYTHONPATH=src:. .venv/bin/python benchmarks/serving/grpc_inprocess.py \\
        --model <kit>/models/rf.onnx
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


class _Context:
    """A grpc.aio servicer context as far as ``ModelInfer`` uses it: no metadata, no deadline."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("user-agent", "grpc-python"),)

    def time_remaining(self) -> float | None:
        return None

    def set_trailing_metadata(self, trailers: Any) -> None:
        pass


def _request(raw: bool, features: int) -> bytes:
    from redline.proto import grpc_service_pb2 as pb

    req = pb.ModelInferRequest(model_name="m")
    tensor = req.inputs.add(name="X", datatype="FP32", shape=[1, features])
    x = np.random.default_rng(0).normal(size=features).astype(np.float32)
    if raw:
        req.raw_input_contents.append(x.tobytes())
    else:
        tensor.contents.fp32_contents.extend(x.tolist())
    return bytes(req.SerializeToString())


def _floor(model: Path) -> Any:
    """The bare grpc.aio peer's handler, as written in ``floors/bare_grpc.py``."""
    import onnxruntime as ort

    from redline.proto import grpc_service_pb2 as pb

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    name, outs = session.get_inputs()[0].name, [o.name for o in session.get_outputs()]

    async def handler(req: Any, ctx: Any) -> Any:
        i = req.inputs[0]
        if req.raw_input_contents:
            x = np.frombuffer(req.raw_input_contents[0], np.float32).reshape(list(i.shape))
        else:
            x = np.asarray(i.contents.fp32_contents, np.float32).reshape(list(i.shape))
        res = session.run(outs, {name: x})
        resp = pb.ModelInferResponse(model_name="m", id=req.id)
        for n, r in zip(outs, res, strict=True):
            o = resp.outputs.add()
            o.name, o.datatype = n, "FP32" if r.dtype == np.float32 else "INT64"
            o.shape.extend(r.shape)
            resp.raw_output_contents.append(r.tobytes())
        return resp
    return handler, session.get_inputs()[0].shape[1]


async def measure(model: Path, rounds: int, calls: int) -> dict[str, dict[str, float]]:
    from redline.assembly import build_server
    from redline.config import Settings
    from redline.models import ModelRepository
    from redline.proto import grpc_service_pb2 as pb
    from redline.serving.grpc import lenient

    floor, features = _floor(model)
    handlers: dict[str, Any] = {"floor": floor}
    monitors: list[Any] = []
    for monitored in (False, True):
        root = Path(tempfile.mkdtemp(prefix="redline-grpc-"))
        ModelRepository(root).add_onnx("m", str(model))
        settings = Settings()
        settings.server.watch_repository = False
        settings.server.grpc_enabled = False
        settings.monitoring.enabled = monitored
        settings.runtime.warmup_batch_sizes = [1]
        server = build_server(settings, ModelRepository(root))
        await server.registry.sync()
        handlers["redline_monitored" if monitored else "redline"] = server.servicer.ModelInfer
        if server.monitor is not None:
            monitors.append(server.monitor)
    decode = lenient(pb.ModelInferRequest.FromString, "ModelInferRequest")
    context = _Context()
    out: dict[str, dict[str, float]] = {}
    for kind in ("typed", "raw"):
        body = _request(kind == "raw", int(features))
        for handler in handlers.values():  # warm each path
            for _ in range(500):
                _serialize(await handler(decode(body), context))
        gc.collect()
        cpu: dict[str, list[float]] = {name: [] for name in handlers}
        for r in range(rounds):
            for name in (list(handlers) if r % 2 else list(handlers)[::-1]):
                handler = handlers[name]
                t0 = time.process_time_ns()
                for _ in range(calls):
                    _serialize(await handler(decode(body), context))
                cpu[name].append((time.process_time_ns() - t0) / calls / 1000)
                for monitor in monitors:  # the tick's fold, outside the timed calls
                    monitor.drain()
        out[kind] = {name: round(statistics.median(v), 2) for name, v in cpu.items()}
        out[kind]["redline_monitored_vs_floor"] = round(
            out[kind]["redline_monitored"] / out[kind]["floor"], 2)
    return out


def _serialize(response: Any) -> bytes:
    """As the service's serializer (``grpc_wire.serialize``), written here so that trees from
    before ``grpc_wire`` can be measured too."""
    return response if type(response) is bytes else response.SerializeToString()  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True,
                    help="an ONNX model with one FP32 input [batch, features]")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=4000, help="calls a round and handler")
    args = ap.parse_args()
    result = asyncio.run(measure(args.model, args.rounds, args.calls))
    print(json.dumps({"us_cpu_per_call": result}, indent=1))


if __name__ == "__main__":
    main()
