"""A small HTTP load tool for the recommender comparison: closed loop and open loop.

Closed loop: ``c`` workers each send the next request when the last one answered. Open loop:
requests are due at a fixed rate and latency counts from the due time, so a server that falls
behind is charged for the queue it builds (no coordinated omission).

Requests go over redline's own load-tool connections (``redline.bench.clients``: keep-alive
HTTP/1.1 on an ``asyncio.Protocol``, each request's bytes built once per body), about a fifth of
aiohttp's CPU a request: the tool shares the machine's cores with the servers it measures, and
what it spends is taken from them.

While either runs, what the process held before is frozen out of the garbage collector
(``gc.freeze``): the comparison keeps the example's 128k events in memory, and a full
collection over them paused this process 20-50 ms, late sends that were counted against
whichever server was being measured (``tick_tail.py`` found them).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

from redline.bench.clients import RequestFailed, RestPool, post_request


@dataclass
class Result:
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def to_dict(self) -> dict:
        return {"rps": round(self.rate, 1), "p50_ms": round(self.p50_ms, 2),
                "p99_ms": round(self.p99_ms, 2), "requests": self.requests,
                "errors": self.errors}


def _result(latencies: list[float], errors: int, seconds: float) -> Result:
    if not latencies:  # nothing answered: no rate is sustained
        return Result(0, errors, seconds, float("inf"), float("inf"))
    lat = np.asarray(latencies) * 1000
    return Result(len(latencies), errors, seconds, float(np.percentile(lat, 50)),
                  float(np.percentile(lat, 99)))


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """What this process holds now, out of the collector's full passes, until the run ends."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Connections:
    """A ``RestPool`` of keep-alive connections to one URL, posting JSON bodies; each body's
    request bytes are built once."""

    def __init__(self, url: str, limit: int) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path or "/"
        self.pool = RestPool(self.host, self.port, limit)
        self._requests: dict[bytes, bytes] = {}  # body -> its request's bytes

    async def post(self, body: bytes) -> bytes | None:
        """The answer's body, or None for an error status or a failed connection."""
        request = self._requests.get(body)
        if request is None:
            request = self._requests[body] = post_request(
                self.host, self.port, self.path, body, {"Content-Type": "application/json"})
        try:
            return await self.pool.send(request)
        except RequestFailed:
            return None

    def close(self) -> None:
        self.pool.close()


async def closed_loop(url: str, bodies: Callable[[int], bytes], concurrency: int,
                      duration_s: float, warmup_s: float = 0.5) -> Result:
    with frozen_heap():
        return await _closed_loop(url, bodies, concurrency, duration_s, warmup_s)


async def open_loop(url: str, bodies: Callable[[int], bytes], rate: float, duration_s: float,
                    warmup_s: float = 0.5, connections: int = 64) -> Result:
    with frozen_heap():
        return await _open_loop(url, bodies, rate, duration_s, warmup_s, connections)


async def _closed_loop(url: str, bodies: Callable[[int], bytes], concurrency: int,
                       duration_s: float, warmup_s: float) -> Result:
    latencies: list[float] = []
    errors = 0
    pool = Connections(url, concurrency)
    start = time.perf_counter()
    measure_from = start + warmup_s
    end = measure_from + duration_s

    async def worker(w: int) -> None:
        nonlocal errors
        n = w
        while (t0 := time.perf_counter()) < end:
            ok = await pool.post(bodies(n)) is not None
            n += concurrency
            if t0 >= measure_from:
                if ok:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1

    try:
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    finally:
        pool.close()
    return _result(latencies, errors, duration_s)


async def _open_loop(url: str, bodies: Callable[[int], bytes], rate: float, duration_s: float,
                     warmup_s: float, connections: int) -> Result:
    answers = await open_loop_answers(url, bodies, rate, duration_s, warmup_s, connections)
    return _result([latency for latency, body in answers if body is not None],
                   sum(body is None for _, body in answers), duration_s)


async def open_loop_answers(url: str, bodies: Callable[[int], bytes], rate: float,
                            duration_s: float, warmup_s: float = 0.5, connections: int = 64
                            ) -> list[tuple[float, bytes | None]]:
    """The open loop's measured requests: (seconds from its due time, the answer's body, or
    None for an error status), for a caller that reads the answers (``tick_tail.py``)."""
    answers: list[tuple[float, bytes | None]] = []
    pool = Connections(url, connections)
    start = time.perf_counter() + 0.05
    total = int((warmup_s + duration_s) * rate)
    warm = int(warmup_s * rate)

    async def one(n: int, due: float) -> None:
        answer = await pool.post(bodies(n))
        if n >= warm:
            answers.append((time.perf_counter() - due, answer))

    tasks = []
    try:
        for n in range(total):
            due = start + n / rate
            pause = due - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
            tasks.append(asyncio.create_task(one(n, due)))
        await asyncio.gather(*tasks)
    finally:
        pool.close()
    return answers
