"""Kafka ingest against a real Kafka-protocol broker (tansu): consumer groups, dead letters with
reasons, exactly-once effect through replays, SIGKILL, restarts and a member joining; on one
Redis and on a 3-node Redis Cluster. Final online values equal a brute-force count of what was
produced."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from redline.features import load_definitions
from redline.features.ingest.kafka import KafkaSource, dead_letter_key
from redline.features.online.redis import RedisStore
from tests.logwatch import LoggedPopen

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

ROOT = Path(__file__).resolve().parents[2]
DEFS = str(Path(__file__).with_name("defs_tx.py"))
BAD = [b"{not json", orjson.dumps({"card_id": "c1", "ts": 1}),
       orjson.dumps({"card_id": "c1", "amount": "12", "merchant": "m", "ts": 0}),
       orjson.dumps({"card_id": "c1", "amount": 1.0, "merchant": "m", "ts": "yesterday"}),
       None]
# tansu holds a group's first join for about half the session timeout (23 s at librdkafka's
# default 45 s, 3 s at 6 s, 1 s at 2 s); a short one also lets the group notice a SIGKILLed
# member quickly (heartbeats come from librdkafka's own thread, ten to a session)
SESSION_MS, HEARTBEAT_MS = 2000, 200
FAST_GROUP = {"session.timeout.ms": str(SESSION_MS), "heartbeat.interval.ms": str(HEARTBEAT_MS)}


def _produce(bootstrap: str, topic: str, n: int, *, seed: int, bad_every: int = 0,
             rate: float = 0.0, until: threading.Event | None = None
             ) -> tuple[dict[str, list[float]], int]:
    """Produce ``n`` good events keyed by card (and a bad one every ``bad_every``), and on at
    ``rate`` until ``until`` is set when it is given (a slow machine's members may take longer
    to start than ``n`` events last); returns the brute-force (count, sum) per card and the
    number of bad messages."""
    from confluent_kafka import Producer

    rng = random.Random(seed)
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    want: dict[str, list[float]] = {}
    bad = 0
    t0 = time.monotonic()
    i = 0
    while i < n or (until is not None and not until.is_set() and i < 50 * n):
        card = f"c{rng.randrange(200)}"
        amount = round(rng.uniform(1, 500), 2)
        cnt = want.setdefault(card, [0, 0.0])
        cnt[0] += 1
        cnt[1] += amount
        ev = {"card_id": card, "amount": amount, "merchant": f"m{rng.randrange(30)}",
              "ts": int(time.time() * 1000) - rng.randint(0, 2000)}
        prod.produce(topic, key=card.encode(), value=orjson.dumps(ev))
        if bad_every and i % bad_every == 0:
            prod.produce(topic, key=b"c1", value=BAD[bad % len(BAD)])
            bad += 1
        if i % 500 == 0:
            prod.poll(0)
            if rate:
                ahead = i / rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        i += 1
    assert prod.flush(30) == 0
    return want, bad


def _online(store: RedisStore, cards: list[str]) -> tuple[np.ndarray, np.ndarray]:
    defs = load_definitions(DEFS)
    reader = store.reader([defs.view("card_stats")], ["card_stats:count_1h",
                                                      "card_stats:amount_sum_1h"])
    vals, _ = reader.read(cards, int(time.time() * 1000), dtype=np.float64)
    return vals[:, 0], vals[:, 1]


def _assert_exact(store: RedisStore, want: dict[str, list[float]]) -> None:
    cards = sorted(want)
    counts, sums = _online(store, cards)
    lost_or_doubled = {c: (int(n), want[c][0]) for c, n in zip(cards, counts, strict=True)
                       if n != want[c][0]}
    assert lost_or_doubled == {}
    assert all(math.isclose(s, want[c][1], rel_tol=1e-9) for c, s in zip(cards, sums, strict=True))


def _drain(src: KafkaSource, total: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while src.counts.accepted + src.counts.dead < total and time.monotonic() < deadline:
        src.poll()
    src.flush()


def test_kafka_source_dead_letters_and_replays_exactly_once(kafka_broker, redis_server) -> None:
    kafka_broker.create_topic("tx1", 4)
    want, bad = _produce(kafka_broker.bootstrap, "tx1", 3000, seed=1, bad_every=97)
    defs = load_definitions(DEFS)
    store = RedisStore(redis_server.url, timeout_ms=10_000)
    src = KafkaSource(defs, store, topic="tx1", bootstrap=kafka_broker.bootstrap, group="g1",
                      batch=250, config=FAST_GROUP)
    _drain(src, 3000 + bad)
    assert (src.counts.accepted, src.counts.dead) == (3000, bad)
    assert set(src.counts.by_reason) >= {"unparseable", "missing", "field"}
    _assert_exact(store, want)
    dead = store.client.hgetall(dead_letter_key("tx1"))
    assert len(dead) == bad and all(b"reason" in v for v in dead.values())
    src.close()
    # a second group reads the whole topic again into the same store: a replay of everything
    # already applied (what a crash before the offset commit looks like): nothing doubles
    again = KafkaSource(defs, store, topic="tx1", bootstrap=kafka_broker.bootstrap, group="g2",
                        batch=333, config=FAST_GROUP)
    _drain(again, 3000 + bad)
    again.close()
    _assert_exact(store, want)
    assert len(store.client.hgetall(dead_letter_key("tx1"))) == bad


def _member(bootstrap: str, url: str, topic: str, name: str, *extra: str) -> LoggedPopen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return LoggedPopen(
        [sys.executable, "-m", "redline.cli", "ingest", "kafka", "-d", DEFS, "--redis-url", url,
         "--bootstrap-servers", bootstrap, "--topic", topic, "--group", f"{topic}-group",
         "--batch", "200",
         "--stats-every", "0.2", "--kafka-option", f"session.timeout.ms={SESSION_MS}",
         "--kafka-option", f"heartbeat.interval.ms={HEARTBEAT_MS}",
         "--kafka-option", f"client.id={name}",
         *extra],
        source=f"ingest kafka {name}", env=env, stdout=subprocess.PIPE, cwd=ROOT)


def _last_stats(member: LoggedPopen) -> dict[str, Any]:
    """The member's latest stats line (it logs one every 0.2 s); {} before the first."""
    for line in reversed(member.log_text().splitlines()):
        if line.startswith("{"):
            try:
                stats: dict[str, Any] = orjson.loads(line)
                return stats
            except orjson.JSONDecodeError:  # a line being written
                continue
    return {}


def _wait_until(what: str, done: Any, members: list[LoggedPopen], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        for p in members:
            assert p.poll() is None, p.log_text()[-2000:]
        assert time.monotonic() < deadline, (
            f"not {what} in {timeout:.0f} s: {[_last_stats(p) for p in members]}")
        time.sleep(0.1)


def _wait_for(store: RedisStore, want: dict[str, list[float]], n: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        counts, _ = _online(store, sorted(want))
        if counts.sum() >= n:
            return
        time.sleep(0.3)


def _kill_test(kafka_broker: Any, store: RedisStore, url: str, topic: str,
               extra: tuple[str, ...] = ()) -> None:
    """Two members on a 4-partition topic while events are produced; one is SIGKILLed mid-stream
    and restarted, then a third joins (a rebalance); at the end every card's count and sum equal
    the brute force: 0 lost, 0 doubled."""
    kafka_broker.create_topic(topic, 4)
    # at least; on until the kill, the restart and the join's rebalance are over, however slow
    # the members' start
    n = 3000
    rebalanced_over_three = threading.Event()
    result: dict[str, Any] = {}
    def produce() -> None:
        result["want"], result["bad"] = _produce(kafka_broker.bootstrap, topic, n, seed=7,
                                                 rate=1500.0, until=rebalanced_over_three)

    producer = threading.Thread(target=produce)
    a = _member(kafka_broker.bootstrap, url, topic, "a", *extra)
    b = _member(kafka_broker.bootstrap, url, topic, "b", *extra)
    procs = [a, b]
    try:
        producer.start()
        # mid-stream: both members own partitions and a has applied some of them
        _wait_until("both members consuming", lambda: _last_stats(b).get("partitions")
                    and _last_stats(a).get("partitions") and _last_stats(a).get("accepted"),
                    [a, b])
        assert producer.is_alive(), "the stream ended before the kill: not mid-stream"
        a.send_signal(signal.SIGKILL)  # mid-stream: batches in flight, offsets not committed
        a.wait(10)
        a2 = _member(kafka_broker.bootstrap, url, topic, "a2", *extra)
        procs.append(a2)
        _wait_until("the restarted member polling", lambda: _last_stats(a2), [a2, b])
        procs.append(_member(kafka_broker.bootstrap, url, topic, "c", *extra))  # joins: rebalance
        # the group's rebalance is over when the three live members own the four partitions
        # between them, each once; the stream flows until then, and a second wave follows
        live = procs[1:]

        def rebalanced() -> bool:
            owned = [_last_stats(p).get("partitions") or [] for p in live]
            return all(owned) and sorted(sum(owned, [])) == [0, 1, 2, 3]

        _wait_until("rebalanced over three members", rebalanced, live)
        assert producer.is_alive(), "the stream ended before the rebalance: not mid-stream"
        rebalanced_over_three.set()
        producer.join(60)
        want = result["want"]
        n = sum(int(c) for c, _ in want.values())
        _wait_for(store, want, n)
        _wait_until("rebalanced over three members", rebalanced, live)
        more, _ = _produce(kafka_broker.bootstrap, topic, 3000, seed=8)
        for card, (cnt, amount) in more.items():
            cur = want.setdefault(card, [0, 0.0])
            cur[0] += cnt
            cur[1] += amount
        _wait_for(store, want, n + 3000)
        time.sleep(1.0)  # anything still being applied twice would land now
        _assert_exact(store, want)
        assert a.returncode == -signal.SIGKILL
        joined = procs[-1]
        joined.send_signal(signal.SIGTERM)
        out, _ = joined.communicate(timeout=30)
        stats = orjson.loads(out.decode().strip().splitlines()[-1])
        assert stats["accepted"] > 0, joined.log_text()[-2000:]  # the rebalance gave it partitions
    finally:
        rebalanced_over_three.set()  # (a failure before it: the producer stops too)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.slow
def test_kafka_members_killed_restarted_and_joining_lose_and_double_nothing(
        kafka_broker, redis_server) -> None:
    _kill_test(kafka_broker, RedisStore(redis_server.url, timeout_ms=10_000), redis_server.url,
               "tx-kill")


@pytest.mark.slow
def test_kafka_exactly_once_on_a_redis_cluster(kafka_broker, redis_cluster, tmp_path) -> None:
    cfg = tmp_path / "redline.yaml"
    cfg.write_text(f"features:\n  store: redis\n  redis_url: {redis_cluster.url}\n"
                   "  redis_cluster: true\n")
    store = RedisStore(redis_cluster.url, cluster=True, timeout_ms=10_000)
    _kill_test(kafka_broker, store, redis_cluster.url, "tx-cluster", ("--config", str(cfg)))


def test_kafka_consumer_lag_is_watermark_minus_applied(kafka_broker, redis_server) -> None:
    """redline_ingest_consumer_lag for Kafka: per owned partition, the high watermark minus the
    offset after the last message applied — all produced messages before the first apply, the
    unapplied rest after each batch, 0 once drained; checked against the real broker's counts."""
    from confluent_kafka import Producer

    from redline.monitoring.ingest import IngestMetrics, MeteredSource

    kafka_broker.create_topic("lag", 2)
    # one record per batch: tansu's high watermark is its last batch's base offset + 1, exact
    # only for one-record batches (see KafkaSource.consumer_lag)
    prod = Producer({"bootstrap.servers": kafka_broker.bootstrap, "batch.num.messages": 1})
    per_part: dict[int, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        assert err is None
        per_part[msg.partition()] = per_part.get(msg.partition(), 0) + 1

    now = int(time.time() * 1000)
    for i in range(400):
        prod.produce("lag", key=f"c{i % 20}".encode(), on_delivery=delivered,
                     value=orjson.dumps({"card_id": f"c{i % 20}", "amount": 1.0,
                                         "merchant": "m", "ts": now}))
    assert prod.flush(30) == 0 and sum(per_part.values()) == 400
    store = RedisStore(redis_server.url, timeout_ms=10_000)
    src = KafkaSource(load_definitions(DEFS), store, topic="lag", group="g-lag", batch=50,
                      bootstrap=kafka_broker.bootstrap, config=FAST_GROUP)
    deadline = time.monotonic() + 30
    while not src.consumer.assignment() and time.monotonic() < deadline:
        src.poll()
    assert {tp.partition for tp in src.consumer.assignment()} == {0, 1}
    seen_partial = False
    while True:
        lags = {int(p): n for t, p, n in src.consumer_lag() if t == "lag"}
        applied = sum(src.applied.values())  # offsets from 0: messages applied and committed
        assert sum(lags.values()) == 400 - applied
        for part, n in lags.items():  # each partition: its produced messages minus applied
            assert n == per_part.get(part, 0) - src.applied.get(part, 0)
        seen_partial = seen_partial or 0 < applied < 400
        if applied == 400 or time.monotonic() > deadline:
            break
        src.poll()
    assert applied == 400 and seen_partial
    metrics = IngestMetrics("lag")
    metered = MeteredSource(src, metrics)
    metered.flush()  # a flush always samples
    got = {(s.labels["partition"], s.labels["source"]): s.value
           for f in metrics.registry.collect() for s in f.samples
           if s.name == "redline_ingest_consumer_lag" and s.labels["stream_or_topic"] == "lag"}
    assert got == {("0", "kafka"): 0.0, ("1", "kafka"): 0.0}
    src.close()


def test_kafka_session_events_reach_the_session_store(kafka_broker, redis_server) -> None:
    from confluent_kafka import Producer

    from redline.features.online.redis import connect
    from redline.serving.predict.session_events import SessionEventWriter
    from redline.serving.predict.sessions import RedisSessionStore

    kafka_broker.create_topic("sess1", 1)
    prod = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for k in range(3):
        prod.produce("sess1", key=b"s1", value=orjson.dumps(
            {"source": "session", "session_id": "s1", "item_id": f"i{k}", "type": "click",
             "ts_ms": 1000 + k}))
    prod.produce("sess1", key=b"s1", value=orjson.dumps(
        {"source": "session", "session_id": "s1", "type": "click"}))
    assert prod.flush(30) == 0
    store = RedisStore(redis_server.url, timeout_ms=10_000)
    sessions = RedisSessionStore(connect(redis_server.url, timeout_ms=2000), redis_server.url)
    src = KafkaSource(load_definitions(DEFS), store, topic="sess1",
                      bootstrap=kafka_broker.bootstrap, group="gs", batch=10,
                      config=FAST_GROUP, sessions=SessionEventWriter(sessions))
    _drain(src, 4)
    src.close()
    assert (src.counts.accepted, src.counts.dead) == (3, 1)
    assert [i.item_id for i in sessions.items("s1")] == ["i2", "i1", "i0"]
    dead = store.client.hgetall(dead_letter_key("sess1"))
    assert len(dead) == 1 and b"item_id must be" in next(iter(dead.values()))
