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
from redline.serving.protocol import decode_grpc
from redline.serving.registry import ModelRegistry
from redline.serving.stages import (
    DECODE,
    ENCODE,
    INFERENCE,
    FlatSeries,
    Observers,
    RequestEnd,
    RequestRecord,
    perf_ns,
)

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
        # Common requests (answered at once: decode, inference, encode) leave their stage
        # times, not a record (serving/stages.py FlatSeries).
        self._flat = FlatSeries(self.observers, "v2", "grpc")
        self._end = RequestEnd(self.observers, "v2", "grpc")  # a recorded request's last call
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

    async def ModelInfer(self, request: Any, context: Any) -> bytes:  # noqa: N802
        """The answer as wire bytes (``grpc_wire``): the service's serializer passes them.

        Observed, the common request (answered at once and ok, no id, no caller
        ``traceparent``, not in the trace sample, not slow) is timed by clock reads and leaves
        five integers in its version's ``StageTimes`` (a windows' sample its arrays too), as a
        V2 REST request does; any other gets its ``RequestRecord``, built from the same
        reads."""
        start_ns = perf_ns()
        start = start_ns * 1e-9  # the same clock as deadline.now()
        observed = bool(self.observers)
        record: RequestRecord | None = None
        handle: ModelHandle | None = None
        meta: dict[str, str] = {}
        rid = ""
        t_dec = 0
        try:
            if isinstance(request, Undecodable):
                raise InvalidInput(request.reason)
            meta = grpc_metadata(context, _METADATA_KEYS)
            decoded = decode_grpc(request)
            rid = decoded.id or ""
            handle = self.registry.get(request.model_name, request.model_version or None)
            if decoded.outputs:
                handle.check_outputs(decoded.outputs)
            if BUDGET_KEY in meta:
                budget = parse_budget(meta[BUDGET_KEY], FROM_METADATA,
                                      default_ms=handle.slo_ms, start=start)
            else:
                remaining = context.time_remaining()
                budget = parse_budget(remaining * 1e3 if remaining is not None else None,
                                      FROM_GRPC_DEADLINE, default_ms=handle.slo_ms, start=start)
            priority = parse_priority(meta.get(PRIORITY_KEY, decoded.parameters.get("priority")))
            if not observed:
                outputs = await handle.infer(decoded.inputs, budget, priority=priority,
                                             datatypes=decoded.datatypes)
            else:  # handle.infer's two steps, so a request answered at once needs no record
                inputs, rows = handle.prepare(decoded.inputs, decoded.datatypes)
                t_dec = perf_ns()
                ran = handle.infer_now(inputs, rows)
                if ran is None:  # queued: timed on a record from here on
                    record = _record(handle, rid, meta, rows, start_ns, t_dec)
                    ran = await handle.infer_queued(inputs, rows, budget.deadline, priority,
                                                    record)
                t_inf = perf_ns()
                outputs = ran
            outputs = handle.select_outputs(outputs, decoded.outputs)
            resp = infer_response(handle.name, handle.version_str, decoded.id, outputs,
                                  decoded.raw_outputs)
        except Exception as exc:  # noqa: BLE001 - mapped below; a bug is logged, never UNKNOWN
            error = as_redline_error(exc)
            if error is None:
                log.exception("unhandled error in ModelInfer")
                error = RedlineError(f"internal error: {type(exc).__name__}")
            traceparent = None
            if observed:
                if record is None:
                    record = RequestRecord("v2", "grpc", start_ns)
                    record.traceparent = meta.get(TRACEPARENT)
                    record.request_id = rid
                    if handle is not None:
                        record.model, record.version = handle.name, handle.version_str
                    if t_dec:
                        record.add(DECODE, start_ns, t_dec)
                traceparent = self._end.finish(record, error.code)
            await grpc_abort(context, error, _trailers(traceparent))
        if not observed:
            return resp
        t_end = perf_ns()
        assert handle is not None  # (grpc_abort raised otherwise)
        if record is None:  # answered at once
            draw: bool | None = None
            if not (rid or TRACEPARENT in meta or handle.shadowed):
                times = self._flat.series(handle.name, handle.version_str)
                if times is not None:
                    draw = self._flat.draw(times, t_end - start_ns)
                    if draw is None:
                        if (handle.keep_io and t_dec >= handle.io_next_ns
                                and handle.sample_due(t_dec)):
                            times.samples += (inputs, outputs)  # the windows' sample
                        times.times += (start_ns, t_dec, t_inf, t_end, rows)
                        return resp
            record = _record(handle, rid, meta, rows, start_ns, t_dec)
            record.spans.append((INFERENCE, t_dec, t_inf))
            record.trace_keep = draw
            handle.keep_io_on(record, inputs, outputs, t_dec)
        record.add(ENCODE, t_inf, t_end)
        traceparent = self._end.finish(record, end_ns=t_end)
        if traceparent is not None:
            context.set_trailing_metadata(_trailers(traceparent))
        return resp


def _trailers(traceparent: str | None) -> tuple[tuple[str, str], ...]:
    return () if traceparent is None else ((TRACEPARENT, traceparent),)


def _record(handle: ModelHandle, rid: str, meta: dict[str, str], rows: int, start_ns: int,
            t_dec: int) -> RequestRecord:
    """The record of a V2 gRPC request that cannot leave flat stage times, decoded at
    ``t_dec``."""
    record = RequestRecord("v2", "grpc", start_ns)
    record.model, record.version = handle.name, handle.version_str
    record.traceparent = meta.get(TRACEPARENT)
    record.request_id = rid
    record.rows = rows
    record.spans.append((DECODE, start_ns, t_dec))
    return record


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
