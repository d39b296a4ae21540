"""``redline.Client`` / ``redline.AsyncClient``: deadlines, safe retries, hedging and failover.

Every call has a budget (``budget_ms``): each attempt is sent with what is left of it (the
``x-redline-budget-ms`` header, or the gRPC deadline), and no attempt starts once it is spent.

- **Retries** happen only where repeating cannot change anything: a connection that failed or
  was reset before an answer, a 503 (not ready, store down) or a 429 (overloaded), a gateway's
  own 502, 503 or 504 page (a balancer whose replica died or hung) - and, for a
  ``/v1`` request that carries a ``session_id`` (it updates session counters), only when the
  request provably never left (connection refused). A retry goes to the next replica.
- **Hedging** (Dean and Barroso, "The Tail at Scale"): when an answer has not come back after
  the client's observed p95, the same request goes to a second replica; the first answer wins
  and the other is cancelled. Hedges are capped to ``hedge_max_share`` of requests (5%). The
  p95 is taken over the answers of the last ``hedge_window_s`` (10 s), recomputed every 50
  calls or second: a burst of slow answers (a replica's pause) raised it, and kept over a count
  alone it stayed raised -- hedging nothing -- for as many calls as the window held. The
  samples are first attempts' times: a first attempt a hedge beat counts as the time it had
  run (a lower bound past the p95). Counting the winner's time instead fed the estimate its
  own hedges' short answers, so it fell call by call until hedges hit their cap. No hedge
  goes sooner than ``hedge_min_ms`` (1 ms).
- **Failover**: endpoints (say one per zone) are ranked fastest healthy first
  (``scaling/endpoints.py``); a failed one is quarantined and re-probed later.

Every attempt a call abandons (the hedge that lost, the rest when the caller gives up) is
cancelled and awaited before the call returns, so none finishes unobserved. HTTP goes through
``scaling/http1.py``, a keep-alive pool whose cost per request does not grow with its size. The
sync ``Client`` runs the async one on a private uvloop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import orjson

from redline import errors
from redline.models.datatypes import NUMPY_TO_V2, V2_TO_NUMPY
from redline.scaling.endpoints import Endpoint, EndpointSet
from redline.scaling.http1 import ConnectError, ConnectionLost, ConnectionPool

T = TypeVar("T")

_BY_CODE: dict[str, type[errors.RedlineError]] = {}


def _error_classes(cls: type[errors.RedlineError]) -> None:
    for sub in cls.__subclasses__():
        _BY_CODE.setdefault(sub.code, sub)
        _error_classes(sub)


_error_classes(errors.RedlineError)


# A gateway's own error pages that a resend may get past: 502 (the replica behind it died or
# answered garbage: HAProxy 2.6 answers so when a replica dies under a connection it reused),
# 503 (no replica in rotation yet), 504 (the replica did not answer in the gateway's time).
GATEWAY_RETRY = (502, 503, 504)


class _Retryable(Exception):
    """An attempt failed in a way that another attempt (elsewhere) may fix."""

    def __init__(self, why: str, sent: bool, error: errors.RedlineError | None = None) -> None:
        super().__init__(why)
        self.sent = sent  # the request may have reached the server
        self.error = error


@dataclass
class InferResult:
    """A V2 answer: outputs by name, which version served it, and how the client got it."""

    outputs: dict[str, np.ndarray]
    model_version: str
    endpoint: str
    attempts: int
    hedged: bool

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]


@dataclass
class ClientStats:
    requests: int = 0
    attempts: int = 0
    retries: int = 0
    hedges: int = 0
    hedge_wins: int = 0
    failovers: int = 0


class AsyncClient:
    """A client for one redline service reachable at one or more endpoints."""

    def __init__(self, endpoints: str | list[str], *, protocol: str = "http",
                 budget_ms: float = 1000.0, hedge: bool = True, hedge_max_share: float = 0.05,
                 hedge_min_samples: int = 50, hedge_after_ms: float | None = None,
                 hedge_quantile: float = 0.95, hedge_window_s: float = 10.0,
                 hedge_min_ms: float = 1.0, max_attempts: int = 3) -> None:
        if protocol not in ("http", "grpc"):
            raise errors.InvalidInput(f"protocol must be 'http' or 'grpc', got {protocol!r}")
        for name, value, ok, want in (
                ("hedge_quantile", hedge_quantile, 0.0 < hedge_quantile <= 1.0, "in (0, 1]"),
                ("hedge_max_share", hedge_max_share, 0.0 <= hedge_max_share <= 1.0,
                 "in [0, 1]"),
                ("hedge_window_s", hedge_window_s, hedge_window_s > 0.0, "above 0"),
                ("hedge_min_ms", hedge_min_ms, hedge_min_ms >= 0.0, "at least 0"),
                ("hedge_min_samples", hedge_min_samples, hedge_min_samples >= 1, "at least 1")):
            if not ok:
                raise errors.InvalidInput(f"{name} must be {want}, got {value!r}")
        addresses = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        self.protocol = protocol
        self.endpoints = EndpointSet.of(addresses)
        self.budget_ms = budget_ms
        self.hedge = hedge and len(addresses) > 1
        self.hedge_max_share = hedge_max_share
        self.hedge_min_samples = hedge_min_samples
        self.hedge_after_ms = hedge_after_ms  # fixed delay instead of the observed p95
        self.hedge_quantile = hedge_quantile
        self.hedge_window_s = hedge_window_s
        # A learnt p95 under a millisecond is scheduler noise, and hedges sent that soon add
        # the load that makes the next answers later: never sooner than this.
        self.hedge_min_ms = hedge_min_ms
        self.max_attempts = max_attempts
        self.stats = ClientStats()
        # Recent answers: (when it came, ``time.monotonic``; its ms), for the hedge's p95.
        self._recent: deque[tuple[float, float]] = deque(maxlen=1000)
        self._p95_ms: float | None = None
        self._p95_at = 0.0  # when the p95 was last computed
        self._http: dict[str, ConnectionPool] = {}
        if protocol == "http":
            for address in addresses:
                try:
                    self._http[address] = ConnectionPool.for_address(address)
                except ValueError as exc:
                    raise errors.InvalidInput(str(exc)) from None
        self._grpc: dict[str, Any] = {}

    # ------------------------------------------------------------------ public calls
    async def infer(self, model: str, inputs: Mapping[str, Any], *, version: str | None = None,
                    budget_ms: float | None = None) -> InferResult:
        """V2 inference: ``inputs`` maps input names to arrays. Idempotent, so hedged."""
        arrays = {name: np.asarray(v) for name, v in inputs.items()}
        return await self._call(("v2", model, version, arrays), budget_ms, idempotent=True)

    async def predict(self, model: str, request: Mapping[str, Any], *,
                      version: str | None = None, budget_ms: float | None = None
                      ) -> dict[str, Any]:
        """``/v1`` entity prediction; ``request`` is the JSON body (``entities``, ``request``...).

        With a ``session_id`` the call updates session state, so it is neither hedged nor
        retried unless the request never left.
        """
        idempotent = not request.get("session_id")
        result: dict[str, Any] = await self._call(("v1", model, version, dict(request)),
                                                  budget_ms, idempotent=idempotent)
        return result

    async def close(self) -> None:
        for pool in self._http.values():
            await pool.close()  # its idle connections; a later call opens new ones
        for channel, _ in self._grpc.values():
            await channel.close()
        self._grpc.clear()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ the policy
    async def _call(self, call: tuple[Any, ...], budget_ms: float | None,
                    idempotent: bool) -> Any:
        budget_s = (budget_ms if budget_ms is not None else self.budget_ms) / 1000.0
        deadline = time.monotonic() + budget_s
        self.stats.requests += 1
        tried: set[str] = set()
        last: _Retryable | None = None
        last_address = ""
        for attempt in range(1, self.max_attempts + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0.0005:
                break
            order = [e for e in self.endpoints.ranked() if e.address not in tried] or \
                self.endpoints.ranked()
            primary = order[0]
            if attempt > 1:
                self.stats.retries += 1
                if primary.address != last_address:
                    self.stats.failovers += 1
            tried.add(primary.address)
            last_address = primary.address
            backup = order[1] if len(order) > 1 and idempotent else None
            try:
                value, endpoint, hedged = await self._hedged(call, primary, backup, deadline)
            except _Retryable as exc:
                # Kept without its traceback: that would hold this frame, and a cycle per
                # failed attempt is what the garbage collector chases in a failure storm.
                last = exc.with_traceback(None)
                if exc.sent and not idempotent:
                    break
                continue
            if isinstance(value, InferResult):
                value.endpoint, value.attempts, value.hedged = endpoint.address, attempt, hedged
            return value
        if last is not None and last.error is not None:
            raise last.error
        if last is None:
            raise errors.DeadlineExceeded(f"the {budget_s * 1000:.0f} ms budget ran out before "
                                          "an answer; raise budget_ms")
        raise errors.DeadlineExceeded(
            f"no replica answered within the {budget_s * 1000:.0f} ms budget (last: {last}); "
            f"endpoints: {', '.join(e.address for e in self.endpoints.endpoints)}")

    def _hedge_allowed(self) -> bool:
        """The cap: hedges stay a small share of requests (checked when a hedge would go, so
        concurrent calls that all waited past the p95 cannot overshoot it together)."""
        return self.stats.hedges + 1 <= self.hedge_max_share * self.stats.requests

    def hedge_delay_ms(self) -> float | None:
        """When a call would be hedged now: the learnt quantile of first attempts over the
        window (at least ``hedge_min_ms``), or ``hedge_after_ms``; None while too few answered."""
        if self.hedge_after_ms is None:
            self._p95_ms = self._quantile_ms(time.monotonic())
        return self._delay_ms()

    def _hedge_delay_s(self) -> float | None:
        if not self.hedge or not self._hedge_allowed():
            return None
        t = time.monotonic()
        if self.hedge_after_ms is None and (self._p95_ms is None or self.stats.requests % 50 == 0
                                            or t - self._p95_at >= 1.0):
            self._p95_ms = self._quantile_ms(t)
        ms = self._delay_ms()
        return None if ms is None else ms / 1000.0

    def _delay_ms(self) -> float | None:
        """The hedge delay from what is known: ``hedge_after_ms``, else the last learnt
        quantile, never under ``hedge_min_ms``."""
        if self.hedge_after_ms is not None:
            return self.hedge_after_ms
        return None if self._p95_ms is None else max(self._p95_ms, self.hedge_min_ms)

    def _quantile_ms(self, t: float) -> float | None:
        """The ``hedge_quantile`` of the answers of the last ``hedge_window_s`` (older ones are
        dropped); None below ``hedge_min_samples`` of them: no hedging until there are."""
        self._p95_at = t
        recent = self._recent
        horizon = t - self.hedge_window_s
        while recent and recent[0][0] < horizon:
            recent.popleft()
        if len(recent) < self.hedge_min_samples:
            return None
        ordered = sorted(ms for _, ms in recent)
        return ordered[min(len(ordered) - 1, int(len(ordered) * self.hedge_quantile))]

    async def _hedged(self, call: tuple[Any, ...], primary: Endpoint, backup: Endpoint | None,
                      deadline: float) -> tuple[Any, Endpoint, bool]:
        delay = self._hedge_delay_s() if backup is not None else None
        started = time.monotonic()
        if delay is None or backup is None:
            value = await self._attempt(call, primary, deadline)
            self._sample(started)
            return value, primary, False
        loop = asyncio.get_running_loop()
        first = loop.create_task(self._attempt(call, primary, deadline))
        owner = {first: primary}
        try:
            done, _ = await asyncio.wait((first,), timeout=delay)
            if done or not self._hedge_allowed():
                value = await first
                self._sample(started)
                return value, primary, False
            self.stats.hedges += 1
            second = loop.create_task(self._attempt(call, backup, deadline))
            owner[second] = backup
            pending: set[asyncio.Task[Any]] = {first, second}
            failure: BaseException | None = None
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()  # retrieved for every finished attempt
                    if exc is None:
                        if task is second:
                            self.stats.hedge_wins += 1
                        if not first.done() or first.exception() is None:
                            self._sample(started)  # the first attempt's time, or its lower bound
                        return task.result(), owner[task], True
                    if failure is None or not isinstance(exc, _Retryable):
                        failure = exc  # an answer error (4xx) outranks a retryable one
                if failure is not None and not isinstance(failure, _Retryable):
                    raise failure
            assert failure is not None
            raise failure
        finally:
            await _abandon(owner)

    async def _attempt(self, call: tuple[Any, ...], endpoint: Endpoint, deadline: float) -> Any:
        self.stats.attempts += 1
        start = time.monotonic()
        remaining = deadline - start
        try:
            if self.protocol == "http":
                value = await self._http_call(call, endpoint, remaining)  # times itself out
            else:
                value = await self._grpc_call(call, endpoint, remaining)
        except _Retryable as exc:
            if not exc.sent or exc.error is None:
                self.endpoints.failed(endpoint)
            raise
        except TimeoutError:
            raise _Retryable("timed out", sent=True) from None
        endpoint.record_ok((time.monotonic() - start) * 1000.0)
        return value

    def _sample(self, started: float) -> None:
        """A first attempt's time for the hedge's p95: its answer's, or how long it had run
        when a hedge's answer came first."""
        ended = time.monotonic()
        self._recent.append((ended, (ended - started) * 1000.0))

    # ------------------------------------------------------------------ HTTP
    async def _http_call(self, call: tuple[Any, ...], endpoint: Endpoint, remaining: float
                         ) -> Any:
        api, model, version, payload = call
        pool = self._http[endpoint.address]
        vpath = f"/versions/{version}" if version else ""
        headers = b"x-redline-budget-ms: %d\r\n" % max(1, round(remaining * 1000.0))
        if api == "v2":
            body = _v2_body(payload)
            url = f"/v2/models/{model}{vpath}/infer"
        else:
            body = orjson.dumps(payload)
            url = f"/v1/models/{model}{vpath}/predict"
        try:
            status, content = await pool.request(url, body, headers, timeout_s=remaining)
        except ConnectError as exc:
            raise _Retryable(f"{endpoint.address}: cannot connect ({exc})", sent=False) from None
        except ConnectionLost as exc:
            raise _Retryable(f"{endpoint.address}: connection lost ({exc})", sent=True) from None
        try:
            doc = orjson.loads(content) if content else {}
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict) or (status >= 500 and "error" not in doc):
            # Case: not redline's answer but a gateway's page (HAProxy, nginx, an ingress).
            error = errors.RedlineError(f"{endpoint.address} answered HTTP {status} that is not "
                                        f"redline's: {_snippet(content)}")
            if status in GATEWAY_RETRY:  # the replica behind it failed or hung: resend
                raise _Retryable(error.message, sent=True, error=error)
            raise error
        if status != 200:
            error = _error_from(status, doc)
            if status in (429, 503):
                raise _Retryable(error.message, sent=True, error=error)
            raise error
        if api == "v1":
            return doc
        outputs = {o["name"]: np.asarray(o["data"], dtype=V2_TO_NUMPY[o["datatype"]])
                   .reshape(o["shape"]) for o in doc["outputs"]}
        return InferResult(outputs, str(doc.get("model_version", "")), endpoint.address, 1,
                           False)

    # ------------------------------------------------------------------ gRPC
    async def _grpc_call(self, call: tuple[Any, ...], endpoint: Endpoint, remaining: float
                         ) -> Any:
        import grpc

        from redline.proto import grpc_service_pb2 as pb
        from redline.proto import redline_v1_pb2 as v1pb

        api, model, version, payload = call
        stubs = self._grpc.get(endpoint.address)
        if stubs is None:
            from redline.proto import grpc_service_pb2_grpc as pbg
            from redline.proto import redline_v1_pb2_grpc as v1g

            channel = grpc.aio.insecure_channel(endpoint.address)
            stubs = self._grpc[endpoint.address] = (
                channel, (pbg.GRPCInferenceServiceStub(channel),
                          v1g.PredictionServiceStub(channel)))
        v2_stub, v1_stub = stubs[1]
        try:
            if api == "v2":
                req = pb.ModelInferRequest(model_name=model, model_version=version or "")
                for name, a in payload.items():
                    req.inputs.add(name=name, datatype=_v2_type(a), shape=list(a.shape))
                    req.raw_input_contents.append(np.ascontiguousarray(a).tobytes())
                resp = await v2_stub.ModelInfer(req, timeout=remaining)
                outputs = {}
                for i, out in enumerate(resp.outputs):
                    dtype = V2_TO_NUMPY[out.datatype]
                    outputs[out.name] = np.frombuffer(resp.raw_output_contents[i], dtype
                                                      ).reshape(list(out.shape))
                return InferResult(outputs, resp.model_version, endpoint.address, 1, False)
            req1 = _v1_request(v1pb, model, version, payload)
            resp1 = await v1_stub.Predict(req1, timeout=remaining)
            from google.protobuf import json_format

            return json_format.MessageToDict(resp1, preserving_proto_field_name=True)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                # UNAVAILABLE is both "no connection" and the server's "not ready": both retry.
                raise _Retryable(f"{endpoint.address}: {exc.details()}", sent=True) from None
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise _Retryable(f"{endpoint.address}: {exc.details()}", sent=True,
                                 error=errors.Overloaded(exc.details() or "overloaded")) from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise _Retryable("timed out", sent=True) from None
            raise _grpc_error(exc) from None


async def _abandon(attempts: Mapping[asyncio.Task[Any], Endpoint]) -> None:
    """Cancel the attempts still running and wait for them (their connections close), and
    take every outcome, so no attempt ends unobserved; a cancel of the caller meanwhile is
    kept for after."""
    running = [task for task in attempts if not task.done()]
    for task in running:
        task.cancel()
    if running:
        outcome = asyncio.gather(*running, return_exceptions=True)
        try:
            await asyncio.shield(outcome)
        except asyncio.CancelledError:
            await outcome
            raise
    for task in attempts:
        if not task.cancelled():
            task.exception()


def _v2_body(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The V2 JSON request; numeric arrays go to orjson as they are (no Python lists)."""
    inputs = []
    for name, a in arrays.items():
        datatype = _v2_type(a)
        flat = a.ravel()
        data: Any = flat if flat.dtype.kind in "biuf" and flat.dtype != np.float16 else \
            flat.tolist()
        inputs.append({"name": name, "shape": list(a.shape), "datatype": datatype,
                       "data": data})
    return orjson.dumps({"inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY)


def _v2_type(a: np.ndarray) -> str:
    try:
        return NUMPY_TO_V2[a.dtype]
    except KeyError:
        raise errors.InvalidInput(f"arrays of dtype {a.dtype} have no V2 datatype") from None


def _v1_request(v1pb: Any, model: str, version: str | None, doc: dict[str, Any]) -> Any:
    req = v1pb.PredictRequest(model_name=model, model_version=version or "",
                              session_id=doc.get("session_id") or "",
                              request_id=doc.get("request_id") or "",
                              batch="instances" in doc)
    for row in doc.get("instances") or [doc]:
        inst = req.instances.add()
        inst.entities.update({k: str(v) for k, v in (row.get("entities") or {}).items()})
        for key, value in (row.get("request") or {}).items():
            if value is None:
                inst.null_fields.append(key)
            else:
                inst.request[key] = float(value)
    return req


def _snippet(content: bytes) -> str:
    """The start of a body that is not JSON, on one line (a gateway's HTML error page)."""
    text = content[:300].decode("utf-8", "replace")
    return " ".join(text.split())[:200] or "(empty)"


def _error_from(status: int, doc: dict[str, Any]) -> errors.RedlineError:
    message = str(doc.get("error") or f"HTTP {status}")
    cls = _BY_CODE.get(str(doc.get("code")), errors.RedlineError)
    return cls(message)


def _grpc_error(exc: Any) -> errors.RedlineError:
    name = exc.code().name
    for cls in _BY_CODE.values():
        if cls.grpc_status == name and cls.__bases__[0] is errors.RedlineError:
            return cls(exc.details() or name)
    return errors.RedlineError(exc.details() or name)


class Client:
    """The blocking face of :class:`AsyncClient` (same arguments), safe to share across threads."""

    def __init__(self, endpoints: str | list[str], **options: Any) -> None:
        import uvloop

        # uvloop: about 40 % less CPU per call than asyncio's own loop (benchmarks/scaling/
        # client_rate.py --uvloop), and this loop is private, so nothing else depends on it.
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="redline-client")
        self._thread.start()
        self._async = AsyncClient(endpoints, **options)

    @property
    def stats(self) -> ClientStats:
        return self._async.stats

    @property
    def endpoints(self) -> EndpointSet:
        return self._async.endpoints

    def hedge_delay_ms(self) -> float | None:
        async def read() -> float | None:  # on the client's loop: its answers change there
            return self._async.hedge_delay_ms()

        return self._run(read())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def infer(self, model: str, inputs: Mapping[str, Any], **kw: Any) -> InferResult:
        return self._run(self._async.infer(model, inputs, **kw))

    def predict(self, model: str, request: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
        return self._run(self._async.predict(model, request, **kw))

    def close(self) -> None:
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                self._run(self._async.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
