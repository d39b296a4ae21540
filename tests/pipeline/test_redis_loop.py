"""The event loop's own Redis connection for /v1 feature reads (``serving/predict/redis_loop.py``)
against a real redis-server: pipelined replies joined to their calls in order, AUTH and SELECT,
a hung and a killed Redis end every pending call (and the next call reconnects), and a Redis that
lost its scripts is read correctly through the pipeline."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import httpx
import orjson
import redis

from redline.errors import StoreUnavailable
from redline.serving.predict.redis_loop import LoopRedis, encode, supports
from tests.conftest import RedisServer
from tests.pipeline.conftest import make_settings


def settles(future: asyncio.Future[Any]) -> Any:
    """A ``(reply, exc)`` callback that settles ``future``."""

    def done(reply: Any, exc: BaseException | None) -> None:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(reply)

    return done


async def call(client: LoopRedis, *args: Any) -> Any:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    client.call(args, settles(future))
    return await future


def test_encode_and_supports() -> None:
    assert encode(["GET", "k", 12, b"\x00\r\n"]) == \
        b"*4\r\n$3\r\nGET\r\n$1\r\nk\r\n$2\r\n12\r\n$3\r\n\x00\r\n\r\n"
    assert supports("redis://127.0.0.1:6379/0")
    assert not supports("rediss://127.0.0.1:6379/0") and not supports("unix:///tmp/r.sock")


async def test_pipelined_replies_reach_their_own_calls(redis_server: RedisServer) -> None:
    client = LoopRedis(redis_server.url, timeout_s=2.0)
    # Sent back to back before the connection exists: they wait for it, then go in order.
    await asyncio.gather(*(call(client, "SET", f"k{i}", f"v{i}") for i in range(200)))
    gets = [call(client, "GET", f"k{i}") for i in reversed(range(200))]
    assert await asyncio.gather(*gets) == [f"v{i}".encode() for i in reversed(range(200))]
    try:
        await call(client, "INCR", "k1")  # an error reply fails that call only...
        raise AssertionError("INCR of a non-number must fail")
    except Exception as exc:  # noqa: BLE001
        assert "not an integer" in str(exc)
    assert await call(client, "GET", "k1") == b"v1"  # ...and the connection goes on
    client.close()


def test_on_uvloop(redis_server: RedisServer) -> None:
    """The server runs on uvloop, whose transports differ from asyncio's."""
    import uvloop

    async def main() -> list[Any]:
        client = LoopRedis(redis_server.url, timeout_s=2.0)
        await call(client, "SET", "u", "1")
        replies = await asyncio.gather(*(call(client, "INCR", "u") for _ in range(50)))
        client.close()
        return replies

    assert uvloop.run(main()) == list(range(2, 52))


async def test_auth_and_db_from_the_url(tmp_path) -> None:
    server = RedisServer(tmp_path / "r").start()
    try:
        redis.Redis(port=server.port).config_set("requirepass", "s3cret")
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
        client = LoopRedis(url, timeout_s=2.0)
        assert await call(client, "SET", "where", "db3") is not None
        direct = redis.Redis(port=server.port, password="s3cret", db=3)
        assert direct.get("where") == b"db3"
        client.close()
        bad = LoopRedis(f"redis://:wrong@127.0.0.1:{server.port}/0", timeout_s=2.0)
        try:
            await call(bad, "GET", "where")
            raise AssertionError("a wrong password must fail the call")
        except StoreUnavailable as exc:
            assert "unavailable" in str(exc)
    finally:
        server.kill()


async def test_hung_redis_fails_pending_calls_after_the_timeout(redis_server: RedisServer
                                                                ) -> None:
    client = LoopRedis(redis_server.url, timeout_s=0.05)
    assert await call(client, "PING") == b"PONG"
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(call(client, "PING") for _ in range(5)),
                                       return_exceptions=True)
        waited = time.perf_counter() - t0
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert all(isinstance(r, StoreUnavailable) and "TimeoutError" in str(r) for r in results)
    assert 0.04 <= waited < 0.5, waited
    assert await call(client, "PING") == b"PONG"  # a new connection after the drop
    client.close()


async def test_killed_redis_fails_then_reconnects(redis_server: RedisServer) -> None:
    client = LoopRedis(redis_server.url, timeout_s=1.0)
    assert await call(client, "PING") == b"PONG"
    redis_server.kill()
    await asyncio.sleep(0.05)
    for _ in range(2):  # the lost connection, then a refused reconnect: both fail, fast
        t0 = time.perf_counter()
        try:
            await call(client, "PING")
            raise AssertionError("a killed Redis must fail the call")
        except StoreUnavailable:
            pass
        assert time.perf_counter() - t0 < 0.6
    await asyncio.to_thread(redis_server.restart)
    assert await call(client, "PING") == b"PONG"
    client.close()


async def test_reads_survive_a_script_flush(serve, repo_path, defs_path, redis_server) -> None:
    """NOSCRIPT (a restarted or flushed Redis): the read is resent with the script body."""
    settings = make_settings(repo_path, defs_path, store="redis", redis_url=redis_server.url)
    srv = serve(settings)
    assert srv.server.pipeline.features._loop_redis is not None  # the loop path is in use
    ts = int(time.time() * 1000)
    body = {"entities": {"card_id": "s1"}, "request": {"amount": 30.0}, "budget_ms": 2000}
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as c:
        ev = b"\n".join(orjson.dumps({"card_id": "s1", "amount": 30.0, "ts": ts - i})
                        for i in range(3))
        assert (await c.post("/v1/events", content=ev)).json()["accepted"] == 3
        first = (await c.post("/v1/models/cards/predict", json=body)).json()
        redis.Redis(port=redis_server.port).script_flush()
        second = (await c.post("/v1/models/cards/predict", json=body)).json()
        third = (await c.post("/v1/models/cards/predict", json=body)).json()
    for doc in (first, second, third):
        assert not doc["degraded"] and not doc["entity_missing"], doc
    assert first["prediction"] == second["prediction"] == third["prediction"]


def _ping_fetcher(client: LoopRedis):  # type: ignore[no-untyped-def]
    """A FeatureFetcher whose read is one PING on the loop's own connection."""
    import numpy as np

    from redline.serving.predict.fetcher import FeatureFetcher

    def start(ids, done):  # type: ignore[no-untyped-def]
        n = len(ids["k"])
        client.call(["PING"], lambda reply, exc: done(
            None if exc else (np.full((n, 1), float(reply == b"PONG"), np.float32),
                              np.zeros(n, bool)), exc))

    return FeatureFetcher(lambda ids: (), None, ["k"], start=start)  # type: ignore[arg-type]


async def test_lone_waiter_polls_within_its_budget(redis_server: RedisServer) -> None:
    """features.redis_spin_us: a lone request polls for its reply, never past its budget's
    wait; `waiting` counts requests whose read has not ended, timed-out ones included."""
    from redline.serving.deadline import Budget, now
    from redline.serving.predict.features import StoreSlow, _fetch

    client = LoopRedis(redis_server.url, timeout_s=5.0)
    fetcher = _ping_fetcher(client)
    budget = Budget(now(), 5000, "test")
    feats, _ = await _fetch(fetcher, {"k": ["a"]}, 1, budget, 0.0, spin_s=0.0002)
    assert feats[0, 0] == 1.0 and fetcher.waiting == 0
    # Three at once: they are counted (so none of them polls) and all answered.
    reads = [asyncio.ensure_future(_fetch(fetcher, {"k": [str(i)]}, 1, budget, 0.0, 0.0002))
             for i in range(3)]
    await asyncio.sleep(0)
    assert fetcher.waiting == 3
    assert [r[0][0, 0] for r in await asyncio.gather(*reads)] == [1.0, 1.0, 1.0]
    assert fetcher.waiting == 0
    # A hung Redis: a poll of up to 5 s still ends with the budget's 50 ms wait.
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.perf_counter()
        try:
            await _fetch(fetcher, {"k": ["h"]}, 1, Budget(now(), 50, "test"), 0.0, spin_s=5.0)
            raise AssertionError("a hung Redis must cut the wait at the budget")
        except StoreSlow:
            pass
        waited = time.perf_counter() - t0
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert 0.03 <= waited < 0.5, waited
    await asyncio.sleep(0)
    assert fetcher.waiting == 0
    client.close()


async def test_a_script_read_leaves_no_garbage_for_the_collector(redis_server: RedisServer,
                                                                defs_path) -> None:  # type: ignore[no-untyped-def]
    """A read's reply callback is freed as soon as it has run, NOSCRIPT retry included: a
    callback that referred to itself for the retry was a reference cycle, and every read's
    objects (13) waited for the garbage collector, setting the pace of its pauses."""
    import gc

    from redline.features import load_definitions
    from redline.features.online.redis import RedisStore
    from redline.serving.predict.redis_loop import script_read

    defs = load_definitions(defs_path)
    store = RedisStore(redis_server.url, timeout_ms=2000)
    reader = store.reader(list(defs.views.values()))
    client = LoopRedis(redis_server.url, timeout_s=2.0)
    start = script_read(client, reader)
    entity = "card"  # defs_cards.py's one entity

    async def read(i: int) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        start({entity: [f"c{i}"]}, settles(future))
        return await future

    await read(0)  # connected, script loaded
    redis.Redis(port=redis_server.port).script_flush()  # the next read goes through NOSCRIPT
    gc.collect()
    gc.disable()
    try:
        results = [await read(i) for i in range(50)]
        garbage = gc.collect()
    finally:
        gc.enable()
    assert all(r is not None for r in results)
    assert garbage < 25, f"{garbage} objects of 50 reads were left to the collector"
    client.close()
    store.close()
