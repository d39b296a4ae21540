"""A small HTTP load tool for the recommender comparison: closed loop and open loop.

Closed loop: ``c`` workers each send the next request when the last one answered. Open loop:
requests are due at a fixed rate and latency counts from the due time, so a server that falls
behind is charged for the queue it builds (no coordinated omission).

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

import aiohttp
import numpy as np


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


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> bytes | None:
    """The answer's body, or None for an error status."""
    async with session.post(url, data=body,
                            headers={"content-type": "application/json"}) as r:
        answer = await r.read()
        return answer if r.status == 200 else None


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
    conn = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=conn) as session:
        start = time.perf_counter()
        measure_from = start + warmup_s
        end = measure_from + duration_s

        async def worker(w: int) -> None:
            nonlocal errors
            n = w
            while (t0 := time.perf_counter()) < end:
                ok = await _post(session, url, bodies(n)) is not None
                n += concurrency
                if t0 >= measure_from:
                    if ok:
                        latencies.append(time.perf_counter() - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
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
    conn = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=conn) as session:
        start = time.perf_counter() + 0.05
        total = int((warmup_s + duration_s) * rate)
        warm = int(warmup_s * rate)

        async def one(n: int, due: float) -> None:
            answer = await _post(session, url, bodies(n))
            if n >= warm:
                answers.append((time.perf_counter() - due, answer))

        tasks = []
        for n in range(total):
            due = start + n / rate
            pause = due - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
            tasks.append(asyncio.create_task(one(n, due)))
        await asyncio.gather(*tasks)
    return answers
