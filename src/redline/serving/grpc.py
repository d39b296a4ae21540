"""The gRPC transport: ``inference.GRPCInferenceService`` on grpc.aio.

It shares the codec (``protocol.py``), the registry and the batcher with the REST app, so both
transports validate, batch and fail alike. The gRPC deadline, when the client sets one, is the
request's budget; otherwise the model's objective is. Errors map to the gRPC status named by each
:class:`~redline.errors.RedlineError`; ``Overloaded`` also sends ``retry-after-ms`` trailing
metadata. Other packages add services with ``extra_handlers`` (``grpc.GenericRpcHandler``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc

from redline import __version__
from redline.config import Settings
from redline.errors import Overloaded, RedlineError
from redline.serving.app import EXTENSIONS, model_metadata
from redline.serving.deadline import now, parse_priority
from redline.serving.proto import grpc_service_pb2 as pb
from redline.serving.proto import grpc_service_pb2_grpc as pbg
from redline.serving.protocol import decode_grpc, fill_grpc_response
from redline.serving.registry import ModelRegistry

log = logging.getLogger("redline.serving")


class InferenceServicer(pbg.GRPCInferenceServiceServicer):
    """The six V2 methods. ``draining`` turns readiness off during shutdown."""

    def __init__(self, registry: ModelRegistry, settings: Settings) -> None:
        self.registry = registry
        self.settings = settings
        self.draining = False

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC names
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerReadyResponse(ready=not self.draining and self.registry.all_ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        if request.name not in self.registry.models():
            await _abort(context, self.registry, request.name)
        ready = not self.draining and self.registry.ready(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerMetadataResponse(name="redline", version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            meta = model_metadata(self.registry, {"name": request.name,
                                                  "version": request.version})
        except RedlineError as exc:
            await _abort_with(context, exc)
        resp = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"],
                                        platform=meta["platform"])
        for kind in ("inputs", "outputs"):
            for t in meta[kind]:
                getattr(resp, kind).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return resp

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        start = now()
        try:
            decoded = decode_grpc(request)
            handle = self.registry.get(request.model_name, request.model_version or None)
            if decoded.outputs:
                handle.check_outputs(decoded.outputs)
            remaining = context.time_remaining()
            budget_s = remaining if remaining is not None else handle.slo_ms / 1000.0
            priority = parse_priority(decoded.parameters.get("priority"))
            outputs = await handle.infer(decoded.inputs, start + budget_s, priority=priority,
                                         datatypes=decoded.datatypes)
            outputs = handle.select_outputs(outputs, decoded.outputs)
        except RedlineError as exc:
            await _abort_with(context, exc)
        resp = pb.ModelInferResponse(model_name=handle.name, model_version=handle.version_str)
        if decoded.id is not None:
            resp.id = decoded.id
        fill_grpc_response(resp, outputs, decoded.raw_outputs)
        return resp


async def _abort(context: Any, registry: ModelRegistry, name: str) -> None:
    try:
        registry.get(name)
    except RedlineError as exc:
        await _abort_with(context, exc)


async def _abort_with(context: Any, exc: RedlineError) -> None:
    if isinstance(exc, Overloaded):
        millis = str(max(1, round(exc.retry_after_s * 1e3)))
        context.set_trailing_metadata((("retry-after-ms", millis),))
    await context.abort(getattr(grpc.StatusCode, exc.grpc_status), exc.message)


def create_grpc_server(
    servicer: InferenceServicer,
    settings: Settings,
    extra_handlers: Sequence[grpc.GenericRpcHandler] = (),
    reuse_port: bool = False,
) -> grpc.aio.Server:
    """A grpc.aio server with the V2 service (not started; bind a port, then ``start()``).

    ``reuse_port`` lets worker processes bind one port together (SO_REUSEPORT, scaling/).
    """
    limit = settings.server.max_body_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
        handlers=list(extra_handlers) or None,
    )
    pbg.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    return server
