"""Redis Streams ingest: exactly-once under SIGKILL, XAUTOCLAIM takeover, dead letters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis

from redline.features import load_definitions
from redline.features.online.redis import RedisStore
from tests.logwatch import LoggedPopen

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

DEFS = str(Path(__file__).with_name("defs_tx.py"))
STREAM = "events"
ROOT = Path(__file__).resolve().parents[2]


def _produce(client: redis.Redis, n_good: int, every_bad: int = 97) -> tuple[dict, int]:
    """XADD good events (returns per-card count and sum) with a bad one every ``every_bad``."""
    expected: dict[str, list[float]] = {}
    bad = 0
    pipe = client.pipeline(transaction=False)
    now = int(time.time() * 1000)
    kinds = [b"{not json", orjson.dumps({"card_id": "c1", "ts": now}),
             orjson.dumps({"card_id": "c1", "amount": "12", "merchant": "m", "ts": now}),
             orjson.dumps({"source": "nope", "card_id": "c1", "amount": 1.0, "ts": now})]
    for i in range(n_good):
        card = f"c{i % 37}"
        amount = round((i * 7919 % 1000) / 7.0, 3)
        expected.setdefault(card, [0, 0.0])
        expected[card][0] += 1
        expected[card][1] += amount
        pipe.xadd(STREAM, {"d": orjson.dumps({"card_id": card, "amount": amount,
                                               "merchant": f"m{i % 11}", "ts": now})})
        if i % every_bad == 0:
            pipe.xadd(STREAM, {"d": kinds[bad % len(kinds)]})
            bad += 1
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    return expected, bad


def _consumer(url: str, name: str, *extra: str) -> LoggedPopen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return LoggedPopen(
        [sys.executable, "-m", "redline.cli", "ingest", "redis-stream", "-d", DEFS,
         "--redis-url", url, "--stream", STREAM, "--group", "g", "--consumer", name,
         "--batch", "100", "--stats-every", "0", *extra],
        source=f"ingest {name}", env=env, stdout=subprocess.PIPE, cwd=ROOT,
    )


def _processed(client: redis.Redis) -> int:
    stats = client.hgetall(f"{STREAM}:stats")
    return int(stats.get(b"accepted", 0)) + int(stats.get(b"dead", 0))


def _wait(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


def _pending_of(client: redis.Redis, consumer: str) -> set[bytes]:
    """The ids of the stream's entries that ``consumer`` read and has not acknowledged."""
    return {e["message_id"] for e in client.xpending_range(STREAM, "g", "-", "+", 100_000,
                                                            consumername=consumer)}


def test_sigkill_mid_stream_loses_and_repeats_nothing(redis_server) -> None:
    client = redis.Redis.from_url(redis_server.url)
    expected, bad = _produce(client, 12_000)
    total = 12_000 + bad
    # consumer A: killed with SIGKILL mid-stream
    a = _consumer(redis_server.url, "A")
    _wait(lambda: _processed(client) > 2_000)
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=10)
    after_a = _processed(client)
    assert after_a < total, "A finished before the kill; the test proves nothing"
    held_by_a = _pending_of(client, "A")  # read by A, never written: B must claim them
    # consumer B: a new name, claims A's pending entries (XAUTOCLAIM) and is killed too
    b = _consumer(redis_server.url, "B", "--claim-idle-ms", "200")
    _wait(lambda: _processed(client) > after_a + 2_000)
    assert not held_by_a & _pending_of(client, "A"), "B left A's pending entries unclaimed"
    b.send_signal(signal.SIGKILL)
    b.wait(timeout=10)
    # A restarted under its own name takes over B's pending entries and finishes the stream
    a2 = _consumer(redis_server.url, "A", "--claim-idle-ms", "200")
    _wait(lambda: _processed(client) >= total)
    time.sleep(0.3)  # anything still pending would be applied now: it must not be
    a2.send_signal(signal.SIGTERM)
    out, _ = a2.communicate(timeout=10)

    assert _processed(client) == total
    assert client.xpending(STREAM, "g")["pending"] == 0
    stats = client.hgetall(f"{STREAM}:stats")
    assert int(stats[b"accepted"]) == 12_000
    assert int(stats[b"dead"]) == bad
    assert client.xlen(f"{STREAM}:dead") == bad
    reasons = {e[1][b"reason"].split(b":")[0].split(b" ")[0]
               for e in client.xrange(f"{STREAM}:dead")}
    assert reasons == {b"unparseable", b"missing", b"field", b"unknown"}
    # exact counts and sums per card in the online store
    defs = load_definitions(DEFS)
    view = defs.view("card_stats")
    reader = RedisStore(redis_server.url).reader([view], ["card_stats:count_1h",
                                                          "card_stats:amount_sum_1h"])
    cards = sorted(expected)
    values, missing = reader.read(cards, dtype=float)
    assert not missing.any()
    for card, (cnt, total_amount) in zip(cards, values, strict=True):
        assert cnt == expected[card][0]
        assert total_amount == pytest.approx(expected[card][1], rel=1e-12)
    assert b'"accepted"' in out


def test_stale_consumer_cannot_double_apply(redis_server) -> None:
    """A consumer whose entries were claimed by another applies nothing when it wakes up."""
    from redline.features.ingest import StreamConsumer

    client = redis.Redis.from_url(redis_server.url)
    defs = load_definitions(DEFS)
    store = RedisStore(redis_server.url)
    slow = StreamConsumer(defs, store, stream=STREAM, group="g", consumer="slow", batch=50,
                          claim_idle_ms=10_000)
    _produce(client, 50, every_bad=1000)
    entries = client.xreadgroup("g", "slow", {STREAM: ">"}, count=100)[0][1]
    assert len(entries) == 51
    fast = StreamConsumer(defs, store, stream=STREAM, group="g", consumer="fast", batch=50,
                          claim_idle_ms=0)
    assert fast.claim() == 51
    assert slow._apply(entries) == 0  # the stale batch is refused entirely
    reader = store.reader([defs.view("card_stats")], ["card_stats:count_1h"])
    values, _ = reader.read([f"c{i}" for i in range(37)])
    assert values.sum() == 50


def test_consumer_survives_a_redis_restart(redis_server) -> None:
    """Redis killed and restarted (empty): the consumer retries, re-creates its group, goes on."""
    client = redis.Redis.from_url(redis_server.url)
    _produce(client, 500, every_bad=10_000)
    proc = _consumer(redis_server.url, "A")
    try:
        _wait(lambda: _processed(client) >= 501)
        redis_server.kill()
        time.sleep(0.5)  # the consumer sees the outage and backs off
        redis_server.restart()
        client = redis.Redis.from_url(redis_server.url)
        _produce(client, 300, every_bad=10_000)
        _wait(lambda: _processed(client) >= 301, timeout=30)
        assert int(client.hget(f"{STREAM}:stats", "accepted")) == 300
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    err = proc.log_text()
    assert "unavailable" in err and "retrying" in err


def test_two_live_consumers_share_a_stream_and_the_survivor_claims(redis_server) -> None:
    """N consumers in one group split the stream; when one dies the living one takes over."""
    client = redis.Redis.from_url(redis_server.url)

    def pending_of(name: str) -> int:
        try:
            summary = client.xpending(STREAM, "g")
        except redis.ResponseError:  # the consumers have not created the group yet
            return 0
        per = {c["name"]: c["pending"] for c in summary["consumers"]}
        return int(per.get(name.encode(), per.get(name, 0)))

    def members() -> set[str]:
        try:
            return {c["name"].decode() for c in client.xinfo_consumers(STREAM, "g")}
        except redis.ResponseError:
            return set()

    b = _consumer(redis_server.url, "B", "--claim-idle-ms", "300")
    a = _consumer(redis_server.url, "A", "--claim-idle-ms", "300")
    try:
        _wait(lambda: members() == {"A", "B"})  # both wait on the stream before events arrive
        expected, bad = _produce(client, 10_000)
        _wait(lambda: pending_of("A") > 0)  # A holds a batch it has not applied yet
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        orphaned = pending_of("A")
        _wait(lambda: _processed(client) >= 10_000 + bad)
        time.sleep(0.5)
    finally:
        b.send_signal(signal.SIGTERM)
        out, _ = b.communicate(timeout=10)
    stats = orjson.loads(out.splitlines()[-1])
    assert stats["claimed"] >= orphaned  # the living consumer applied the dead one's entries
    assert int(client.hget(f"{STREAM}:stats", "accepted")) == 10_000
    assert client.xpending(STREAM, "g")["pending"] == 0
    values, _ = RedisStore(redis_server.url).reader(
        [load_definitions(DEFS).view("card_stats")], ["card_stats:count_1h"]).read(
        sorted(expected), dtype=float)
    assert values[:, 0].tolist() == [expected[c][0] for c in sorted(expected)]


def test_pipelined_write_survives_a_lost_script_and_counts_once(redis_server) -> None:
    """The consumer sends each batch's script call from its own thread and reads the reply later
    (``SentWrite``); a Redis that lost its scripts answers NOSCRIPT, the call is made again with
    the script loaded, and every event still counts once."""
    from redline.features.ingest import StreamConsumer

    client = redis.Redis.from_url(redis_server.url)
    expected, _ = _produce(client, 600)
    defs = load_definitions(DEFS)
    store = RedisStore(redis_server.url, timeout_ms=10_000)
    cons = StreamConsumer(defs, store, stream=STREAM, group="g", consumer="a", batch=50,
                          block_ms=5)
    total = client.xlen(STREAM)
    done = cons.poll()
    client.script_flush()  # as after a restart (the stream survives here, the scripts do not)
    # until every entry is applied (an empty read waits Redis's ~100 ms timer tick, so not a
    # fixed number of polls); one applied twice would overshoot the total
    for _ in range(100):
        if done >= total:
            break
        done += cons.poll()
    done += cons.flush()
    assert done == total
    reader = store.reader([defs.view("card_stats")], ["card_stats:count_1h",
                                                      "card_stats:amount_sum_1h"])
    cards = sorted(expected)
    values, missing = reader.read(cards, dtype=float)
    assert not missing.any()
    assert [int(v) for v in values[:, 0]] == [expected[c][0] for c in cards]
    assert values[:, 1] == pytest.approx([expected[c][1] for c in cards], rel=1e-12)
