"""Warm the whole request path before readiness, leaving no trace: the first request after ready
should cost what the hundredth does.

What was cold, measured on the demo's fraud model (``benchmarks/first_request``, profiled request
by request): ONNX Runtime's first run on the event loop's thread (~150 µs: its per-thread state;
the model warm-up ran on another thread), numpy's first ``percentile`` in the latency window
(~200 µs), the first passes of the REST app, the ``/v1`` decoder, reader, transforms and encoder
through Python's specializing interpreter (~50-100 µs), uvicorn's protocol and the uvloop
transport on first use, and the memory store's first read of each entity (it merges the
entity's tiles once, ~250 µs, then reads a copy).

How, without side effects: the server's real code runs, but on stand-ins for everything that
keeps state. A private REST app (the same :class:`RestApp` and ``/v1`` routes) over a
:class:`_TwinRegistry`, whose handles are :meth:`ModelHandle.twin` copies (same session and
worker thread, own batcher and counters), and a private :class:`PredictPipeline` (own caches,
breaker, latency windows, counters, sessions in memory, its own Redis loop connection) reading
the real store, is served by a private uvicorn listener on ``127.0.0.1:0`` with the server's own
protocol class, and this module sends it real HTTP requests over a socket: V2 JSON (fast path and
general decoder), V2 binary, ``/v1`` at each warm-up batch size. Nothing of the server's own
registry counters, caches, observers (metrics, traces, drift and quality windows, slow log),
sessions or rollout routing sees them; the listener is closed before readiness turns true. With
the memory store, every entity it already holds (``features.preload``) is read once through the
real reader, so its merged windows exist before the first request (a pure function of the
tiles: what that entity's first read would compute). ``tests/serving/test_warmup.py`` checks
that every stats and metrics endpoint is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import uvicorn

from redline.serving.handle import ModelHandle
from redline.serving.stages import NEVER, RequestRecord, StageTimes

if TYPE_CHECKING:
    from redline.serving.predict.pipeline import PredictPipeline

log = logging.getLogger("redline.serving")

ROUNDS = 10  # Python 3.11 specializes a function's bytecode after ~8 calls
# A warm-up request slower than this is the model's own time: the cold path's few hundred
# microseconds are noise beside it, so that body is not sent again (a 400-layer model's thirty
# V2 requests held a two-worker server's start-up for 13.5 s).
SLOW_WARMUP_S = 0.05
WARMUP_ENTITY = "__warmup__"
PRIME_BUDGET_S = 2.0  # most time spent reading the memory store's entities at start
PRIME_ROWS = 256


class _TwinRegistry:
    """The registry as the warm-up's private app and pipeline see it: every version its twin
    (a :class:`HandleLookup` for the pipeline; the app asks only ``get`` of it, as the warm-up
    sends infer and predict requests only)."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry
        self._twins: dict[int, ModelHandle] = {}

    def _twin(self, handle: ModelHandle) -> ModelHandle:
        twin = self._twins.get(id(handle))
        if twin is None:
            twin = self._twins[id(handle)] = handle.twin()
        return twin

    def get(self, name: str, version: str | None = None, key: Any = None) -> ModelHandle:
        return self._twin(self._registry.get(name, version))

    def loaded(self, name: str) -> list[ModelHandle]:
        return [self._twin(h) for h in self._registry.loaded(name)]

    def models(self) -> list[str]:
        return list(self._registry.models())

    def ready(self, name: str, version: str | None = None) -> bool:
        return bool(self._registry.ready(name, version))


class _Quiet:
    """An observer that keeps nothing: the private app takes the observed code path (records,
    stages, the flat stage times of common requests) when the real one does."""

    def request_finished(self, record: RequestRecord) -> None:
        return None

    def stage_times(self, api: str, transport: str, model: str, version: str,
                    steps: tuple[str, ...] = ()) -> StageTimes:
        return _Unread()


class _Unread:
    """Stage times nobody reads (a twin's, dropped with it after the warm-up); returned as a
    :class:`StageTimes`, so the type checker holds it to everything the request path uses."""

    def __init__(self) -> None:
        self.times: list[int] = []
        self.spill_at = 4096  # nobody reads them: a spill only drops them (a bound)
        self.samples: list[Any] = []
        self.slow_ns = self.countdown = NEVER

    def gap(self) -> int:
        return NEVER

    def spill(self) -> None:
        self.times = []


class _Listener(uvicorn.Server):
    """uvicorn without signal handling (the real server owns the process's signals)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def warm_request_path(registry: Any, pipeline: PredictPipeline | None, settings: Any,
                            observed: bool, protocol: Any) -> int:
    """Send the private app real requests for every loaded model (see the module doc); returns
    how many models answered every request 200. Never raises: a failure only leaves that path
    cold (a request that does not answer 200 is an error line naming its model, once).

    Runs before the server's listeners open, so no real request can arrive meanwhile: a
    rollout's router is set aside for its duration (its random draws and sticky keys are the
    real requests')."""
    router = registry.route_by(None)
    try:
        return await _warm(registry, pipeline, settings, observed, protocol)
    finally:
        registry.route_by(router)


async def _warm(registry: Any, pipeline: PredictPipeline | None, settings: Any, observed: bool,
                protocol: Any) -> int:
    t0 = time.perf_counter()
    primed = _prime_memory_store(registry, pipeline)
    requests: list[tuple[str, bytes, int]] = []
    for name in registry.models():
        try:
            handle = registry.get(name)
            if not handle.warm_requests:
                continue
            requests.extend(_requests(name, handle, pipeline, settings))
        except Exception as exc:  # noqa: BLE001 - not loaded, or a model nothing fits
            log.debug("warm-up of %s skipped: %s", name, exc)
    if not requests:
        return 0
    await _connect_store(pipeline)
    try:
        answered, refused = await _send_privately(registry, pipeline, settings, observed,
                                                  protocol, requests)
    except Exception as exc:  # noqa: BLE001 - never a reason not to serve
        log.warning("request-path warm-up failed, first requests may be slower: %s", exc)
        return 0
    for model, (path, status, reason) in refused.items():
        log.error("warm-up of model %s: POST %s answered %d (%s); its first requests will "
                  "meet a cold path, and real ones may fail the same way", model, path, status,
                  reason)
    warm = {model for model in answered if model not in refused}
    log.info("request path warm: %d requests to %d models, %d entities read, %.0f ms",
             sum(answered.values()), len(warm), primed, (time.perf_counter() - t0) * 1e3)
    return len(warm)


# ---------------------------------------------------------------------- the requests
def _requests(name: str, handle: Any, pipeline: PredictPipeline | None,
              settings: Any) -> list[tuple[str, bytes, int]]:
    """(model, raw HTTP request, times to send it): each V2 body ``ROUNDS`` times, each ``/v1``
    body (already one per round) once."""
    bodies: list[tuple[str, bytes, dict[str, str]]] = []
    v2 = f"/v2/models/{name}/infer"
    bodies.append((v2, v2_body(handle), {}))
    bodies.append((v2, v2_body(handle, outputs=True), {}))  # the general decoder and encoder
    binary = v2_binary(handle)
    if binary is not None:
        bodies.append((v2, binary[1], {"inference-header-content-length": str(binary[0])}))
    sizes = sorted({1, *settings.runtime.warmup_batch_sizes})
    for rows in sizes:
        for k in range(ROUNDS):
            body = v1_body(pipeline, handle, rows, k)
            if body is None:
                break
            bodies.append((f"/v1/models/{name}/predict", body, {}))
    out = []
    for path, body, headers in bodies:
        extra = "".join(f"{h}: {v}\r\n" for h, v in headers.items())
        head = (f"POST {path} HTTP/1.1\r\nhost: warmup\r\ncontent-type: application/json\r\n"
                f"{extra}content-length: {len(body)}\r\n\r\n").encode()
        out.append((name, head + body, 1 if path.startswith("/v1/") else ROUNDS))
    return out


def v2_body(handle: Any, outputs: bool = False) -> bytes:
    """A V2 JSON request of zeros shaped from the model's inputs (one row)."""
    inputs = []
    for spec in handle.session.inputs:
        shape = [1 if d is None or d < 0 else d for d in (spec.shape or [1])]
        value: Any = "" if spec.datatype == "BYTES" else (False if spec.datatype == "BOOL" else 0)
        inputs.append({"name": spec.name, "datatype": spec.datatype, "shape": shape,
                       "data": [value] * int(np.prod(shape))})
    doc: dict[str, Any] = {"inputs": inputs}
    if outputs:
        doc["outputs"] = [{"name": n} for n in handle.output_names]
    return orjson.dumps(doc)


def v2_binary(handle: Any) -> tuple[int, bytes] | None:
    """A V2 request with Triton's binary tensor extension (zeros, one row), or None for a
    model with a BYTES input."""
    example = handle.session.example_inputs(1)
    specs = handle.session.inputs
    if any(s.datatype == "BYTES" for s in specs):
        return None
    head = orjson.dumps({"inputs": [
        {"name": s.name, "datatype": s.datatype, "shape": list(example[s.name].shape),
         "parameters": {"binary_data_size": example[s.name].nbytes}} for s in specs]})
    return len(head), head + b"".join(example[s.name].tobytes() for s in specs)


def v1_body(pipeline: PredictPipeline | None, handle: Any, rows: int = 1,
            k: int = 0) -> bytes | None:
    """A ``/v1`` body of ``rows`` rows for ``handle``, or None when the model reads no features
    (it has no ``/v1`` route). Round ``k`` changes the request fields (so a prediction cache
    misses) and, every other round, the entity ids (so a feature near cache misses)."""
    if pipeline is None or pipeline.defs is None:
        return None
    try:
        route = pipeline.route(handle)
    except Exception:  # noqa: BLE001 - a model that /v1 cannot serve is simply not warmed there
        return None
    if not route.views:
        return None
    present = _present_ids(pipeline.store, route, 1) if k % 2 == 0 else None
    instances = []
    for r in range(rows):
        entities = {v.entity.join_key: (present[v.entity.name][0] if present
                                         and v.entity.name in present
                                         else f"{WARMUP_ENTITY}{k}.{r}")
                    for v in route.views}
        instances.append({"entities": entities,
                          "request": {f: float(k + r) for f in route.request_fields}})
    if rows == 1:
        return orjson.dumps(instances[0])
    return orjson.dumps({"instances": instances})


# ---------------------------------------------------------------------- the private listener
async def _send_privately(registry: Any, pipeline: PredictPipeline | None, settings: Any,
                          observed: bool, protocol: Any, requests: list[tuple[str, bytes, int]]
                          ) -> tuple[dict[str, int], dict[str, tuple[str, int, str]]]:
    """Send each request its number of times (once only when it is slower than
    ``SLOW_WARMUP_S``); returns how many requests each model answered 200, and each model's
    first other answer as (path, status, the error body's message)."""
    from redline.serving.app import RestApp
    from redline.serving.observers import Observers, StageTimesObserver
    from redline.serving.predict import MemorySessionStore, PredictPipeline
    from redline.serving.v1_rest import V1Rest

    twins = _TwinRegistry(registry)
    quiet: StageTimesObserver = _Quiet()  # held by mypy to what the monitor's feed offers
    observers = Observers([quiet]) if observed else Observers()
    app = RestApp(twins, settings, observers)  # type: ignore[arg-type]
    shadow = None
    if pipeline is not None:
        cfg = settings.pipeline
        shadow = PredictPipeline(twins, settings, pipeline.defs, pipeline.store,
                                 MemorySessionStore(cfg.session_ttl_s, cfg.session_max_events,
                                                    cfg.session_max_items))
        V1Rest(shadow, app).install(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=protocol, loop="none", lifespan="off", access_log=False,
                            log_level="warning", proxy_headers=False, server_header=False,
                            log_config=None)  # uvicorn's would close the process's handlers
    listener = _Listener(config)
    task = asyncio.get_running_loop().create_task(listener.serve(sockets=[sock]))
    answered: dict[str, int] = {}
    refused: dict[str, tuple[str, int, str]] = {}
    try:
        while not listener.started and not task.done():
            await asyncio.sleep(0.001)
        if task.done():
            task.result()
        reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        try:
            for model, raw, times in requests:
                for _ in range(times):
                    began = time.perf_counter()
                    writer.write(raw)
                    status, body = await _read_response(reader)
                    if status == 200:
                        answered[model] = answered.get(model, 0) + 1
                    elif model not in refused:
                        refused[model] = (_request_path(raw), status, _error_message(body))
                    if time.perf_counter() - began > SLOW_WARMUP_S:
                        break
        finally:
            writer.close()
    finally:
        listener.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        sock.close()
        if shadow is not None:
            shadow.features.close()  # its own thread and Redis connection; the store stays open
    return answered, refused


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 response."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, await reader.readexactly(length)


def _request_path(raw: bytes) -> str:
    return raw.split(b" ", 2)[1].decode("latin-1")


def _error_message(body: bytes) -> str:
    """The V2 error body's message, else the body's start."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return str(doc["error"])
    return body[:200].decode("utf-8", "replace")


# ---------------------------------------------------------------------- the shared store
async def _connect_store(pipeline: PredictPipeline | None) -> None:
    """The real pipeline's connections made now, with nothing read or written: the event
    loop's Redis connection (a PING) and the session script loaded into Redis (its cache of
    scripts is not data; the first session update would load it)."""
    from redline.serving.predict.sessions import ITEMS_SCRIPT, UPDATE_SCRIPT, RedisSessionStore

    if pipeline is None or pipeline.store is None:
        return
    try:
        await pipeline.features.connect()
        sessions = pipeline.sessions
        if isinstance(sessions, RedisSessionStore):
            await asyncio.to_thread(sessions.client.script_load, UPDATE_SCRIPT)
            await asyncio.to_thread(sessions.client.script_load, ITEMS_SCRIPT)
    except Exception as exc:  # noqa: BLE001 - the first request meets it and reports it
        log.debug("warm-up could not reach the store: %s", exc)


# ---------------------------------------------------------------------- the memory store
def _prime_memory_store(registry: Any, pipeline: PredictPipeline | None) -> int:
    """Read every entity the memory store holds once through each ``/v1`` route's reader (up to
    ``PRIME_BUDGET_S``), so its merged windows are cached before the first request; returns how
    many entity rows were read."""
    if pipeline is None or pipeline.defs is None:
        return 0
    store = pipeline.store
    if store is None or store.kind != "memory":
        return 0
    deadline = time.perf_counter() + PRIME_BUDGET_S
    read = 0
    for name in registry.models():
        try:
            route = pipeline.route(registry.get(name))
        except Exception:  # noqa: BLE001 - not a /v1 model
            continue
        if route.reader is None:
            continue
        ids = _present_ids(store, route, None)
        if not ids:
            continue
        longest = max(len(v) for v in ids.values())
        columns = {e: ids.get(e) or [WARMUP_ENTITY] for e in route.entity_names}
        for lo in range(0, longest, PRIME_ROWS):
            if time.perf_counter() > deadline:
                log.info("memory store priming stopped after %.1f s", PRIME_BUDGET_S)
                return read
            n = min(PRIME_ROWS, longest - lo)
            batch = {e: [col[(lo + r) % len(col)] for r in range(n)]
                     for e, col in columns.items()}
            route.reader.read(batch)
            read += n
    return read


def _present_ids(store: Any, route: Any, limit: int | None) -> dict[str, list[str]] | None:
    """Ids per entity of ``route`` that the memory store holds data for (at most ``limit``
    each), or None when it holds none.

    Keys are ``rl:{<entity>:<id>}:<view>:<version>`` (features/online/base.py)."""
    from redline.features.events import KEY_PREFIX

    if store is None or store.kind != "memory":
        return None
    wanted = {f":{v.name}:{v.version}": v.entity.name for v in route.views}
    found: dict[str, dict[str, None]] = {}
    for key in list(store.data):
        if not key.startswith(KEY_PREFIX + ":{"):
            continue
        close = key.find("}:")
        entity = wanted.get(key[close + 1:]) if close > 0 else None
        if entity is None:
            continue
        head = key[len(KEY_PREFIX) + 2:close]
        if head.startswith(entity + ":"):
            seen = found.setdefault(entity, {})
            if limit is None or len(seen) < limit:
                seen[head[len(entity) + 1:]] = None
        if limit is not None and len(found) == len(route.entity_names) and all(
                len(v) >= limit for v in found.values()):
            break
    return {e: list(v) for e, v in found.items()} or None
