"""The gRPC transport: ``inference.GRPCInferenceService`` on grpc.aio.

It shares the codec (``protocol.py``), the registry and the batcher with the REST app, so both
transports validate, batch and fail alike. The budget is the ``x-redline-budget-ms`` metadata
when sent, else the gRPC deadline, else the model's objective, parsed by the one
``deadline.parse_budget``. Errors map through ``edge.py`` (``Overloaded`` sends ``retry-after-ms``
trailing metadata). A message that does not decode is INVALID_ARGUMENT, never UNKNOWN: every
method's deserializer here catches the protobuf error and the method answers it. Other packages
add services with ``extra_handlers`` (``grpc.GenericRpcHandler``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from redline import __version__
from redline.config import Settings
from redline.errors import InvalidInput, RedlineError
from redline.proto import grpc_service_pb2 as pb
from redline.serving.deadline import (
    FROM_GRPC_DEADLINE,
    FROM_METADATA,
    parse_budget,
    parse_priority,
)
from redline.serving.edge import (
    BUDGET_KEY,
    PRIORITY_KEY,
    TRACEPARENT,
    as_redline_error,
    grpc_abort,
    grpc_metadata,
)
from redline.serving.grpc_wire import infer_response, serialize
from redline.serving.handle import ModelHandle
from redline.serving.metadata import EXTENSIONS, model_metadata
from redline.serving.observers import Observers
from redline.serving.protocol import InferRequest, decode_grpc
from redline.serving.registry import ModelRegistry
from redline.serving.request_end import V2End
from redline.serving.stages import RequestRecord, perf_ns

log = logging.getLogger("redline.serving")
SERVICE = "inference.GRPCInferenceService"
_METADATA_KEYS = frozenset((BUDGET_KEY, PRIORITY_KEY, TRACEPARENT))


class Undecodable:
    """Stands for a request message that did not parse; the method answers INVALID_ARGUMENT."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def lenient(parse: Callable[[bytes], Any], what: str) -> Callable[[bytes], Any]:
    """A request deserializer that returns :class:`Undecodable` instead of raising (which grpc.aio
    would answer UNKNOWN)."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's message
            return Undecodable(f"the request is not a valid {what} message ({exc})")

    return deserialize


async def check_decoded(request: Any, context: Any) -> None:
    if isinstance(request, Undecodable):
        await grpc_abort(context, InvalidInput(request.reason))


class InferenceServicer:
    """The six V2 methods. ``draining`` turns readiness off during shutdown."""

    def __init__(self, registry: ModelRegistry, settings: Settings,
                 observers: Observers | None = None) -> None:
        self.registry = registry
        self.settings = settings
        self.observers = observers if observers is not None else Observers()
        self._end = V2End(self.observers, "grpc")  # a request's monitoring: one call
        self.draining = False

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC names
        await check_decoded(request, context)
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        await check_decoded(request, context)
        return pb.ServerReadyResponse(ready=not self.draining and self.registry.all_ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        await check_decoded(request, context)
        try:
            self.registry.get(request.name)
        except RedlineError as exc:
            if request.name not in self.registry.models():
                await grpc_abort(context, exc)
        ready = not self.draining and self.registry.ready(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        await check_decoded(request, context)
        return pb.ServerMetadataResponse(name="redline", version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        await check_decoded(request, context)
        try:
            meta = model_metadata(self.registry, {"name": request.name,
                                                  "version": request.version})
        except RedlineError as exc:
            await grpc_abort(context, exc)
        resp = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"],
                                        platform=meta["platform"])
        for kind in ("inputs", "outputs"):
            for t in meta[kind]:
                getattr(resp, kind).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return resp

    async def ModelInfer(self, request: Any, context: Any) -> bytes:  # noqa: N802 - gRPC names
        """Parse, run, answer: the answer as wire bytes (``grpc_wire``), which the service's
        serializer passes on. While someone observes, monitoring is one call at the end
        (``request_end.V2End``), from the clock reads taken on the way: the REST path's steps."""
        start_ns = perf_ns()
        observed = self.observers.observed
        handle: ModelHandle | None = None
        record: RequestRecord | None = None
        decoded: InferRequest | None = None
        traceparent: str | None = None
        rid = ""
        rows = decoded_ns = 0
        try:
            if isinstance(request, Undecodable):
                raise InvalidInput(request.reason)
            meta = grpc_metadata(context, _METADATA_KEYS)
            traceparent = meta.get(TRACEPARENT)
            decoded = decode_grpc(request)
            rid = decoded.id or ""
            handle = self.registry.get(request.model_name, request.model_version or None)
            if decoded.outputs:
                handle.check_outputs(decoded.outputs)
            if BUDGET_KEY in meta:
                budget = parse_budget(meta[BUDGET_KEY], FROM_METADATA,
                                      default_ms=handle.slo_ms, start=start_ns * 1e-9)
            else:
                remaining = context.time_remaining()
                budget = parse_budget(remaining * 1e3 if remaining is not None else None,
                                      FROM_GRPC_DEADLINE, default_ms=handle.slo_ms,
                                      start=start_ns * 1e-9)
            priority = parse_priority(meta.get(PRIORITY_KEY, decoded.parameters.get("priority")))
            inputs, rows = handle.prepare(decoded.inputs, decoded.datatypes)
            if observed:
                decoded_ns = perf_ns()
                if handle.steps_on_record:  # a graph: its steps are timed on the record
                    record = self._end.record(handle, rid, traceparent, rows, start_ns,
                                              decoded_ns)
            outputs = handle.infer_now(inputs, rows, record, budget.deadline)
            if outputs is None:  # the batcher is busy or the run is long: it queues
                if observed and record is None:  # timed on a record from here on
                    record = self._end.record(handle, rid, traceparent, rows, start_ns,
                                              decoded_ns)
                outputs = await handle.infer_queued(inputs, rows, budget.deadline, priority,
                                                    record)
            inferred_ns = perf_ns() if observed else 0
            resp = infer_response(handle.name, handle.version_str, decoded.id,
                                  handle.select_outputs(outputs, decoded.outputs),
                                  decoded.raw_outputs)
        except Exception as exc:  # noqa: BLE001 - mapped below; a bug is logged, never UNKNOWN
            error = as_redline_error(exc)
            if error is None:
                log.exception("unhandled error in ModelInfer")
                error = RedlineError(f"internal error: {type(exc).__name__}")
            traced = None
            if observed or record is not None:
                if not rows and decoded is not None:
                    rows = decoded.rows  # a request refused by the checks counts what it sent
                traced = self._end.failed(error.code, start_ns, traceparent, handle, rid, rows,
                                          decoded_ns, record)
            await grpc_abort(context, error, _trailers(traced))
        if not observed:
            return resp
        assert handle is not None  # (grpc_abort raised otherwise)
        traced = self._end.answered(handle, rid, traceparent, rows, inputs, outputs, start_ns,
                                    decoded_ns, inferred_ns, perf_ns(), record)
        if traced is not None:
            context.set_trailing_metadata(_trailers(traced))
        return resp


def _trailers(traceparent: str | None) -> tuple[tuple[str, str], ...]:
    return () if traceparent is None else ((TRACEPARENT, traceparent),)


def inference_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """The V2 service with lenient deserializers (see :func:`lenient`)."""
    methods: dict[str, tuple[Any, Any]] = {
        "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
        "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
        "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
        "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
        "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
    }
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=lenient(req.FromString, req.__name__),
            response_serializer=serialize,
        )
        for name, (req, _response) in methods.items()
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def create_grpc_server(
    servicer: InferenceServicer,
    settings: Settings,
    extra_handlers: Sequence[grpc.GenericRpcHandler] = (),
    reuse_port: bool = False,
    interceptors: Sequence[Any] = (),
) -> grpc.aio.Server:
    """A grpc.aio server with the V2 service (not started; bind a port, then ``start()``).

    ``reuse_port`` lets worker processes bind one port together (SO_REUSEPORT, scaling/).
    """
    limit = settings.server.max_body_bytes
    metadata = settings.server.grpc_max_metadata_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # gRPC's soft limit refuses a share of the calls between it and the hard one: both
            # at the setting, every call over it is RESOURCE_EXHAUSTED and every other is served
            ("grpc.max_metadata_size", metadata),
            ("grpc.absolute_max_metadata_size", metadata),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
        handlers=[inference_handler(servicer), *extra_handlers],
        interceptors=list(interceptors) or None,
    )
    return server
