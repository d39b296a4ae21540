"""One measured run (open or closed loop), and the search for the highest rate within a p99.

Open loop (``rate`` set): request *i* is due at ``start + t_i`` from the schedule, sent on a free
connection (or a new one, up to ``connections``), and its latency runs from ``t_i`` — waiting for
a connection counts. Closed loop (no ``rate``): ``connections`` workers each send their next
request when the previous answer arrives, latency from the send (perf_analyzer's
``--concurrency-range`` shape). Latencies go into an HDR histogram in microseconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from redline.bench.clients import (
    GrpcCaller,
    RequestFailed,
    RestPool,
    grpc_request_bytes,
    post_request,
    rest_body,
)
from redline.bench.schedule import send_times
from redline.models.datatypes import V2_TO_NUMPY

now = time.perf_counter  # uvloop's loop.time() has 1 ms resolution
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass
class LoadSpec:
    url: str  # http://host:port for REST, host:port or grpc://host:port for gRPC
    model: str
    protocol: str = "json"  # json | binary | grpc
    rate: float | None = None  # requests/s: open loop; None: closed loop
    connections: int = 1  # closed loop: concurrency; open loop: connection limit
    schedule: str = "constant"  # constant | poisson
    duration_s: float = 10.0
    warmup_s: float = 2.0
    rows: int = 1
    budget_ms: float | None = None
    inputs: dict[str, tuple[str, np.ndarray]] | None = None  # name -> (datatype, array)
    seed: int = 0
    # Entity predictions instead of V2 infer: the JSON body of POST /v1/models/{model}/predict
    # (REST), or a serialised redline.v1 PredictRequest (gRPC).
    v1_body: bytes | None = None
    path: str | None = None  # REST path for v1_body instead of /v1/models/{model}/predict (peers)
    # Open loop: spin (instead of sleeping) this long before each send, yielding the CPU to
    # any other runnable task on every turn when ``spin_yield`` (see ``_measure``).
    spin_s: float = 0.0015
    spin_yield: bool = False
    # Open loop: wait for each send time on a timerfd (``bench/timer.py``) instead of the
    # sleep-then-spin above: exact send times without holding a core (Linux).
    precise_timer: bool = False


@dataclass
class BenchResult:
    spec: LoadSpec
    histogram: HdrHistogram
    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    error_samples: dict[str, str] = field(default_factory=dict)
    # When the measured seconds began, on the wall clock (``time.time()``): a harness that reads
    # the server's CPU time can then count exactly those seconds, not the warm-up or start-up.
    started_unix: float = 0.0

    @property
    def throughput(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s else 0.0

    def percentile_ms(self, p: float) -> float:
        return self.histogram.get_value_at_percentile(p) / 1000.0 if self.ok else float("nan")

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "url": spec.url, "model": spec.model, "protocol": spec.protocol,
            "mode": "open" if spec.rate else "closed", "rate": spec.rate,
            "connections": spec.connections, "schedule": spec.schedule if spec.rate else None,
            "duration_s": round(self.elapsed_s, 3), "rows": spec.rows,
            "sent": self.sent, "ok": self.ok, "errors": dict(self.errors),
            "error_samples": self.error_samples,
            "throughput_rps": round(self.throughput, 1),
            "window_unix": [round(self.started_unix, 4),
                            round(self.started_unix + self.elapsed_s, 4)],
            "latency_ms": {
                **{f"p{p:g}": round(self.percentile_ms(p), 4) for p in PERCENTILES},
                "max": round(self.histogram.get_max_value() / 1000.0, 4) if self.ok else None,
                "mean": round(self.histogram.get_mean_value() / 1000.0, 4) if self.ok else None,
            },
        }


# ---------------------------------------------------------------------------- inputs
def synth_inputs(model_meta: dict[str, Any], rows: int, seed: int = 0) -> dict[str, Any]:
    """Random inputs matching a V2 model metadata object (floats ~N(0,1), small ints)."""
    rng = np.random.default_rng(seed)
    result: dict[str, tuple[str, np.ndarray]] = {}
    for spec in model_meta["inputs"]:
        datatype = spec["datatype"]
        shape = [rows if i == 0 and d == -1 else (d if d > 0 else 1)
                 for i, d in enumerate(spec["shape"])]
        if datatype == "BYTES":
            array = np.full(shape, "x", dtype=object)
        elif datatype == "BOOL":
            array = rng.integers(0, 2, size=shape).astype(bool)
        elif datatype.startswith(("INT", "UINT")):
            array = rng.integers(0, 10, size=shape).astype(V2_TO_NUMPY[datatype])
        else:
            array = rng.standard_normal(size=shape).astype(V2_TO_NUMPY[datatype])
        result[spec["name"]] = (datatype, array)
    return result


def fetch_metadata(spec: LoadSpec) -> dict[str, Any]:
    """The model's V2 metadata, over the transport being measured."""
    if spec.protocol == "grpc":
        import grpc

        from redline.proto import grpc_service_pb2 as pb
        from redline.proto import grpc_service_pb2_grpc as pbg

        with grpc.insecure_channel(grpc_target(spec.url)) as channel:
            reply = pbg.GRPCInferenceServiceStub(channel).ModelMetadata(
                pb.ModelMetadataRequest(name=spec.model), timeout=10)
        return {"inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                           for t in reply.inputs]}
    with urllib.request.urlopen(f"{spec.url.rstrip('/')}/v2/models/{spec.model}", timeout=10) as r:
        meta: dict[str, Any] = json.loads(r.read())
    return meta


def grpc_target(url: str) -> str:
    return url.split("://", 1)[1] if "://" in url else url


# ---------------------------------------------------------------------------- runs
async def _caller_factory(spec: LoadSpec) -> tuple[Callable[[], Awaitable[Any]], Any]:
    """A function that makes one call, pooled over ``connections`` connections, and a closer."""
    headers = {"x-redline-budget-ms": str(spec.budget_ms)} if spec.budget_ms else {}
    if spec.v1_body is not None and spec.protocol == "grpc":
        caller = GrpcCaller(grpc_target(spec.url), spec.v1_body,
                            method="/redline.v1.PredictionService/Predict")
        return caller.call, caller.close
    if spec.protocol == "grpc":
        assert spec.inputs is not None
        caller = GrpcCaller(grpc_target(spec.url), grpc_request_bytes(spec.model, spec.inputs))
        return caller.call, caller.close
    if spec.protocol not in ("json", "binary"):
        raise ValueError(f"unknown protocol {spec.protocol!r}: use json, binary or grpc")
    if spec.v1_body is not None:
        body, hdrs = spec.v1_body, {"content-type": "application/json", **headers}
        path = spec.path or f"/v1/models/{spec.model}/predict"
    else:
        assert spec.inputs is not None
        body, hdrs = rest_body(spec.inputs, spec.protocol == "binary", headers)
        path = f"/v2/models/{spec.model}/infer"
    rest = spec.url.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.partition(":")
    pool = RestPool(host, int(port or 80), spec.connections)
    request = post_request(host, int(port or 80), path, body, hdrs)

    async def call() -> Any:
        return await pool.send(request)

    async def close() -> None:
        pool.close()

    return call, close


async def run_load_async(spec: LoadSpec, progress: Callable[[float, int], None] | None = None
                         ) -> BenchResult:
    """Warm up, then measure for ``duration_s``."""
    if spec.inputs is None and spec.v1_body is None:
        spec.inputs = synth_inputs(await asyncio.to_thread(fetch_metadata, spec), spec.rows,
                                   spec.seed)
    call, close = await _caller_factory(spec)
    try:
        await call()  # fail fast: unreachable server, unknown model, bad input
        if spec.warmup_s > 0:
            await _measure(spec, call, spec.warmup_s, None)
        return await _measure(spec, call, spec.duration_s, progress)
    finally:
        await close()


async def _measure(spec: LoadSpec, call: Callable[[], Awaitable[Any]], duration_s: float,
                   progress: Callable[[float, int], None] | None) -> BenchResult:
    result = BenchResult(spec, HdrHistogram(1, 120_000_000, 3))
    record = result.histogram.record_value
    errors = result.errors

    async def one(due: float) -> None:
        try:
            await call()
        except RequestFailed as exc:
            errors[exc.kind] += 1
            result.error_samples.setdefault(exc.kind, str(exc)[:200])
            return
        except OSError as exc:
            errors["connect"] += 1
            result.error_samples.setdefault("connect", str(exc)[:200])
            return
        result.ok += 1
        record(max(1, int((now() - due) * 1e6)))

    start = now()
    result.started_unix = time.time()
    end = start + duration_s
    ticker = None
    if progress is not None:
        async def tick() -> None:
            while True:
                await asyncio.sleep(0.25)
                progress(min(1.0, (now() - start) / duration_s), result.ok)
        ticker = asyncio.ensure_future(tick())
    try:
        if spec.rate:
            # Open loop: fire on schedule, never wait for answers.
            times = send_times(spec.rate, duration_s, spec.schedule, spec.seed) + start
            tasks: set[asyncio.Task[None]] = set()
            spin, spin_yield = spec.spin_s, spec.spin_yield
            timer = None
            if spec.precise_timer:
                from redline.bench.timer import PreciseTimer

                timer = PreciseTimer()
            for due in times:
                if timer is not None:
                    await timer.until(float(due))
                    task = asyncio.ensure_future(one(float(due)))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    result.sent += 1
                    continue
                # uvloop's timers have 1 ms resolution: sleeping the whole gap would send late
                # and charge the lateness to the server. Sleep most of it, then spin (the loop
                # still runs I/O between spins).
                delay = due - now()
                if delay > spin + 0.0005:
                    await asyncio.sleep(delay - spin)
                while now() < due:
                    await asyncio.sleep(0)
                    if spin_yield:
                        os.sched_yield()
                task = asyncio.ensure_future(one(float(due)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                result.sent += 1
            if timer is not None:
                timer.close()
            if tasks:
                await asyncio.wait(tasks, timeout=max(5.0, duration_s))
        else:
            # Closed loop: each worker sends its next request when the last one is answered.
            async def worker() -> None:
                while now() < end:
                    result.sent += 1
                    await one(now())

            await asyncio.gather(*(worker() for _ in range(spec.connections)))
    finally:
        if ticker is not None:
            ticker.cancel()
    result.elapsed_s = now() - start
    return result


def run_load(spec: LoadSpec, progress: Callable[[float, int], None] | None = None) -> BenchResult:
    import uvloop

    return uvloop.run(run_load_async(spec, progress))


def find_max(
    spec: LoadSpec, slo_p99_ms: float, *, start_rate: float = 200.0, steps: int = 5,
    on_step: Callable[[BenchResult, bool], None] | None = None,
) -> tuple[BenchResult | None, list[BenchResult]]:
    """The highest open-loop rate whose p99 meets the objective with under 1% errors.

    Doubles the rate until a run fails the objective, then bisects between the last passing and
    the first failing rate ``steps`` times. Returns the best passing run and every run made.
    """
    runs: list[BenchResult] = []

    def attempt(rate: float) -> tuple[BenchResult, bool]:
        trial = LoadSpec(**{**spec.__dict__, "rate": rate})
        result = run_load(trial)
        errors = sum(result.errors.values())
        passed = (result.ok > 0 and result.percentile_ms(99) <= slo_p99_ms
                  and errors <= 0.01 * max(1, result.sent)
                  and result.throughput >= 0.9 * rate)
        runs.append(result)
        if on_step is not None:
            on_step(result, passed)
        return result, passed

    best: BenchResult | None = None
    low, high = 0.0, None
    rate = start_rate
    while high is None:
        result, passed = attempt(rate)
        if passed:
            best, low = result, rate
            rate *= 2
        else:
            high = rate
    for _ in range(steps):
        if high - low <= max(1.0, 0.02 * high):
            break
        mid = (low + high) / 2 if low else high / 2
        result, passed = attempt(mid)
        if passed:
            best, low = result, mid
        else:
            high = mid
    return best, runs
