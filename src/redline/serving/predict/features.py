"""The feature read of a ``/v1`` request: near cache, circuit breaker, coalesced budget-bound fetch.

The model's online features for every row come in ONE store round trip (the route's reader
covers every view the model, and its fallback, was trained on). A hot entity may come from the
near cache. If the store is slow or down the circuit breaker opens, so later requests skip it at
no cost, and rows come from the near cache (bounded staleness) or the features' declared
defaults; the answer says ``degraded`` and why.

What counts against the store's health is the outcome of store calls only (``fetcher.py``): a
request that stops waiting because its own budget ran out degrades alone, and a client's invalid
input is a 400 that never reaches the breaker.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.errors import InvalidInput
from redline.serving.deadline import Budget
from redline.serving.predict.breaker import CircuitBreaker
from redline.serving.predict.cache import FeatureNearCache
from redline.serving.predict.fetcher import FeatureFetcher, Result
from redline.serving.predict.plan import Route

if TYPE_CHECKING:
    from redline.serving.predict.redis_loop import LoopRedis


class StoreSlow(Exception):
    """The store did not answer within what the request's budget allowed (seconds in args)."""


class FeatureRead:
    """Reads a route's features for a request; owns the worker thread and per-route fetchers."""

    def __init__(self, breaker: CircuitBreaker, near: FeatureNearCache, remote: bool,
                 loop_redis: LoopRedis | None = None, spin_s: float = 0.0) -> None:
        self.breaker = breaker
        self.near = near
        # Remote stores are read coalesced: single Redis on the event loop's own connection
        # (``redis_loop.py``), other remote stores on one worker thread; the embedded one inline.
        self._executor = (ThreadPoolExecutor(1, thread_name_prefix="redline-features")
                          if remote else None)
        self._loop_redis = loop_redis
        # Polling for a loop read's reply before sleeping (``features.redis_spin_us``).
        self._spin_s = spin_s if loop_redis is not None else 0.0
        self._fetchers: dict[int, FeatureFetcher] = {}

    def fetcher(self, route: Route) -> FeatureFetcher | None:
        if route.reader is None or self._executor is None:
            return None
        fetcher = self._fetchers.get(id(route))
        if fetcher is None:
            start = None
            if self._loop_redis is not None:
                from redline.serving.predict.redis_loop import script_read

                start = script_read(self._loop_redis, route.reader)
            fetcher = self._fetchers[id(route)] = FeatureFetcher(
                route.reader.read_timed, self._executor, route.entity_names,
                self.store_call_ended, start=start)
        return fetcher

    @property
    def loop_redis(self) -> LoopRedis | None:
        """The event loop's own Redis connection, when reads use one (session reads share it)."""
        return self._loop_redis

    def made(self, route: Route) -> FeatureFetcher | None:
        """The route's fetcher if a read has made it (for stats: reading them makes nothing)."""
        return self._fetchers.get(id(route))

    async def connect(self, timeout_s: float = 1.0) -> None:
        """Open the event loop's own Redis connection now, with a PING (the request-path
        warm-up, ``serving/warmup.py``), so the first read does not pay for the connect. A
        failure is left for the first read to meet and report."""
        client = self._loop_redis
        if client is None:
            return
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(reply: Any, exc: BaseException | None) -> None:
            if not answered.done():
                answered.set_result(exc)

        client.call(["PING"], done)
        await asyncio.wait_for(answered, timeout_s)

    def forget(self, route: Route) -> None:
        self._fetchers.pop(id(route), None)

    def store_call_ended(self, exc: BaseException | None) -> None:
        """The breaker's one input: how a store call ended (not how long a waiter waited)."""
        if exc is None:
            self.breaker.success()
        elif not isinstance(exc, InvalidInput):  # a client's bad input says nothing of health
            self.breaker.failure()

    async def read(self, route: Route, ids: dict[str, list[str]], n: int, budget: Budget,
                   reserve_s: float, reasons: list[str]) -> Result:
        """(n × features float32 in the route's column order, bool mask of missing entities)
        and, when the store answered (not the near cache or defaults), n × views newest event
        times (epoch ms, NaN: none) for the feature age at read."""
        reader = route.reader
        if reader is None:
            return np.zeros((n, 0), np.float32), np.zeros(n, bool)
        near = self.near if self.near.enabled else None
        keys = [(route.cache_key, *(ids[e][r] for e in route.entity_names)) for r in range(n)]
        if near is not None:
            hits = [near.get(k) for k in keys]
            if all(h is not None for h in hits):
                return (np.stack([h[1] for h in hits]),  # type: ignore[index]
                        np.array([h[2] for h in hits], dtype=bool))  # type: ignore[index]
        if self.breaker.allow():
            fetcher = self.fetcher(route)
            got: Result
            try:
                if fetcher is None:
                    try:
                        got = reader.read_timed(ids)  # inline, with the age
                    except InvalidInput:
                        self.breaker.success()  # the store answered; the input was wrong
                        raise
                    except Exception as exc:
                        self.store_call_ended(exc)
                        raise
                    self.store_call_ended(None)
                else:
                    got = await _fetch(fetcher, ids, n, budget, reserve_s, self._spin_s)
            except InvalidInput:
                raise
            except StoreSlow as exc:
                reason = f"feature store slow (no answer within {exc.args[0] * 1e3:.1f} ms)"
            except Exception as exc:  # noqa: BLE001 - any store failure degrades, never a 500
                reason = f"feature store unavailable ({type(exc).__name__})"
            else:
                if near is not None:
                    feats, missing = got[0], got[1]
                    for r in range(n):
                        near.put(keys[r], feats[r], bool(missing[r]))
                return got
        else:
            reason = "feature store circuit open"
        return self._degraded(route, keys, n, near, reason, reasons)

    @staticmethod
    def _degraded(route: Route, keys: list[Any], n: int, near: FeatureNearCache | None,
                  reason: str, reasons: list[str]) -> Result:
        """Near cache within the fallback staleness, else declared defaults."""
        feats = np.tile(route.defaults, (n, 1))
        missing = np.zeros(n, dtype=bool)
        from_cache = 0
        oldest = 0.0
        for r in range(n):
            hit = near.get(keys[r], fallback=True) if near is not None else None
            if hit is not None:
                oldest = max(oldest, hit[0])
                feats[r] = hit[1]
                missing[r] = hit[2]
                from_cache += 1
        if from_cache == n:
            reasons.append(f"{reason}: features from near cache, up to {oldest * 1e3:.0f} ms old")
        elif from_cache:
            reasons.append(f"{reason}: {from_cache} of {n} rows from near cache, the rest from "
                           "declared defaults")
        else:
            reasons.append(f"{reason}: features are the declared defaults")
        return feats, missing

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        if self._loop_redis is not None:
            self._loop_redis.close()


async def _fetch(fetcher: FeatureFetcher, ids: dict[str, list[str]], n: int, budget: Budget,
                 reserve_s: float, spin_s: float = 0.0) -> Result:
    """The coalesced read, waited for no longer than the budget leaves after the model.

    ``spin_s``: when this request is the only one waiting for a read, the loop keeps polling
    (``asyncio.sleep(0)``: one zero-timeout poll per turn, other ready work still runs) up to
    ``spin_s`` before it sleeps. Why: every sleep needs a wake-up, and a woken process waits for
    its core behind whatever else runs there — on a shared machine the largest part of the /v1
    tail (docs/architecture.md). Polling through the ~50-100 µs round trip halves
    the wake-ups per request (3,700 -> 1,900 context switches in a 3.5 s slice at 500 req/s) for
    about the same CPU time. Only a lone waiter polls: under concurrency the loop is busy anyway
    and N pollers would cost N task steps per turn."""
    # The model's recent p99 plus ~1 ms for assembly and the answer; the budget adds the timer
    # resolution, so a cut-short wait still answers by the deadline.
    wait = budget.wait_for(reserve_s + 0.001)
    future = fetcher.read(ids, n)
    timer = asyncio.get_running_loop().call_later(wait, _expire, future, wait)
    try:
        if spin_s and fetcher.waiting == 1 and not future.done():
            end = time.perf_counter() + min(spin_s, wait)
            while not future.done() and time.perf_counter() < end:
                await asyncio.sleep(0)
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Any], wait: float) -> None:
    if not future.done():
        future.set_exception(StoreSlow(wait))
