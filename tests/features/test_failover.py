"""A Redis primary killed mid-stream and a replica promoted (Sentinel; a Cluster of three primaries
with a replica each), after the primary acknowledged writes its replica never got: the online
store equals a brute-force count of the stream, 0 lost and 0 doubled, for Kafka and Redis
Streams; the session store and the label join follow the failover; reads during it degrade."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import redis

from redline.errors import ConfigError, StoreUnavailable
from redline.features import load_definitions
from redline.features.ingest import StreamConsumer
from redline.features.ingest.kafka import KafkaSource
from redline.features.online.redis import RedisStore, connect
from redline.features.online.redis_failover import start_offsets
from redline.features.online.redis_sentinel import parse_sentinel_url
from tests.conftest import REDIS_SERVER
from tests.features.test_ingest_kafka import DEFS, FAST_GROUP, _assert_exact, _online, _produce
from tests.scaling.redisha import ReplicatedCluster, SentinelGroup, WritesLost, wait_until

STREAM = "events"
T0_MS = int(time.time() * 1000)  # the streams' event time (well inside the 1 h windows)
BACKLOG = 8000  # entries waiting when the consumer starts: it is mid-stream at the failover
# The sentinel test's: its consumer applies thousands of entries between two looks, and on a
# quiet machine once applied a whole BACKLOG before the failover; twice as many keep it mid-stream
SENTINEL_BACKLOG = 2 * BACKLOG


# -- the rules, without servers ------------------------------------------------------------------

def test_sentinel_urls() -> None:
    a = parse_sentinel_url("redis+sentinel://10.0.1.5:26379,10.0.2.5:26380/mymaster/2")
    assert a.sentinels == [("10.0.1.5", 26379), ("10.0.2.5", 26380)]
    assert (a.service, a.db, a.password, a.ssl) == ("mymaster", 2, None, False)
    b = parse_sentinel_url("rediss+sentinel://app:s%40cret@h:1/svc?sentinel_password=x")
    assert (b.username, b.password, b.sentinel_password, b.db, b.ssl) == (
        "app", "s@cret", "x", 0, True)
    assert parse_sentinel_url("redis+sentinel://:pw@h:1/svc").password == "pw"
    assert parse_sentinel_url("redis+sentinel://[::1]:26379/svc").sentinels == [("::1", 26379)]
    for bad, says in [("redis+sentinel://h:1", "/<service>"),
                      ("redis+sentinel://h/svc", "host:port"),
                      ("redis+sentinel://h:1/svc/x", "/<service>"),
                      ("redis+sentinel://h:1/svc?timeout=1", "unknown option")]:
        with pytest.raises(ConfigError, match=says):
            parse_sentinel_url(bad)
    with pytest.raises(ConfigError, match="redis_cluster: false"):
        connect("redis+sentinel://h:1/svc", cluster=True)


def test_a_partition_starts_at_the_lower_of_committed_and_stored() -> None:
    # 0: commits lag the store (normal); 1: the store is behind (a failover dropped writes);
    # 2: nothing stored (a new group); 3: nothing committed; 4: neither (auto.offset.reset)
    start, behind = start_offsets({0: 50, 1: 90, 2: 30, 3: -1001, 4: -1001},
                                  {0: 60, 1: 69, 3: 9}, [0, 1, 2, 3, 4])
    assert start == {0: 50, 1: 70, 2: 30, 3: 10}
    assert behind == {1: 20}


# -- helpers -----------------------------------------------------------------------------------

class Ingesting:
    """A source polled on a thread the way ``run_source`` polls it: a store outage is waited
    out (short backoff), then the source is reset."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.outages: list[str] = []
        # a Kafka source's partitions, read on the polling thread (librdkafka's calls from a
        # second thread wait for the rebalance that the polling thread runs)
        self.assigned = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Ingesting:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.source.poll()
                if isinstance(self.source, KafkaSource):
                    self.assigned = len(self.source.consumer.assignment())
            except StoreUnavailable as exc:
                self.outages.append(exc.message)
                time.sleep(0.05)
                try:
                    self.source.reset()
                except Exception:  # noqa: BLE001 - still down: the next poll says so again
                    pass
        try:
            self.source.flush()
        except StoreUnavailable:
            pass


def _wait(what: str, done: Callable[[], Any], timeout: float = 60.0) -> Any:
    return wait_until(what, done, timeout, every=0.05)


def _counted(store: RedisStore, want: dict[str, list[float]]) -> int:
    try:
        counts, _ = _online(store, sorted(want))
    except StoreUnavailable:
        return -1
    return int(counts.sum())


def _need_redis() -> None:
    if REDIS_SERVER is None:
        pytest.skip("redis-server binary not found on PATH (install it: `make services`)")


@pytest.fixture
def sentinel(tmp_path: Path) -> Any:
    _need_redis()
    group = SentinelGroup(tmp_path / "sentinel").start()
    try:
        yield group
    finally:
        group.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    _need_redis()
    nodes = ReplicatedCluster(tmp_path / "cluster").start()
    try:
        yield nodes
    finally:
        nodes.kill()


def _kafka_across_failover(kafka_broker: Any, store: RedisStore, topic: str,
                           lose: Callable[[], WritesLost], fail_over: Callable[[], Any],
                           during: Callable[[], None] = lambda: None) -> KafkaSource:
    """Events produced at a steady rate into ``topic``, one consumer applying them; mid-stream
    the primary acknowledges writes its replica never gets, the consumer commits their offsets,
    the primary dies and its replica takes over; then more events. Checked by brute force."""
    kafka_broker.create_topic(topic, 4)
    got: dict[str, Any] = {}
    producer = threading.Thread(target=lambda: got.update(
        first=_produce(kafka_broker.bootstrap, topic, 6000, seed=21, rate=1500.0)[0]))
    src = KafkaSource(load_definitions(DEFS), store, topic=topic, group="g",
                      bootstrap=kafka_broker.bootstrap, batch=100, config=FAST_GROUP)
    with Ingesting(src) as ing:
        _wait("partitions assigned", lambda: ing.assigned)
        producer.start()
        _wait("the consumer applying", lambda: src.counts.accepted >= 1200)
        lost = lose()
        mark = src.counts.accepted
        _wait("writes the replica never gets", lambda: src.counts.accepted >= mark + 600)
        time.sleep(0.3)  # their offsets are committed (every 100 ms)
        assert producer.is_alive(), "the stream ended before the failover: not mid-stream"
        lost.failover()
        fail_over()
        during()
        producer.join(60)
        want = got["first"]
        more, _ = _produce(kafka_broker.bootstrap, topic, 1500, seed=22)
        for card, (n, amount) in more.items():
            cur = want.setdefault(card, [0, 0.0])
            cur[0] += n
            cur[1] += amount
        total = sum(n for n, _ in want.values())
        _wait("every event in the store", lambda: _counted(store, want) >= total, 90)
        time.sleep(0.5)  # anything applied twice would land now
    _assert_exact(store, want)  # 0 lost, 0 doubled
    assert ing.outages, "the consumer never saw the failover"
    src.close()
    return src


# -- Kafka ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_kafka_across_a_sentinel_failover_replays_what_the_old_primary_lost(
        kafka_broker: Any, sentinel: SentinelGroup) -> None:
    store = RedisStore(sentinel.url, timeout_ms=10_000)
    old = sentinel.primary
    src = _kafka_across_failover(
        kafka_broker, store, "fo-sentinel", lambda: WritesLost(old, sentinel.replica).start(),
        lambda: sentinel.wait_failover(old))
    # the promoted replica's position was behind the committed offsets: detected and replayed
    assert src.replayed > 0


@pytest.mark.slow
def test_kafka_across_a_cluster_failover_replays_and_reads_follow(
        kafka_broker: Any, cluster: ReplicatedCluster) -> None:
    store = RedisStore(cluster.url, cluster=True, timeout_ms=10_000)
    reads = RedisStore(cluster.url, cluster=True, timeout_ms=50)  # a request's store
    reader = reads.reader([load_definitions(DEFS).view("card_stats")])
    cards = [f"c{i}" for i in range(200)]
    victim = cluster.primaries()[0]
    replica = cluster.replica_of(victim)
    failing: list[float] = []

    def read_through_the_failover() -> None:
        # reads while the slots have no primary fail fast (a request degrades), then the
        # store finds the promoted replica by itself
        def one() -> bool:
            t0 = time.perf_counter()
            try:
                reader.read(cards)
                return True
            except StoreUnavailable:
                failing.append(time.perf_counter() - t0)
                return False
        _wait("reads served by the promoted replica", one, 30)

    src = _kafka_across_failover(
        kafka_broker, store, "fo-cluster", lambda: WritesLost(victim, replica).start(),
        lambda: None, read_through_the_failover)
    cluster.wait_failover(victim, replica)
    assert failing and max(failing) < 1.0, failing  # each failed read gave up at once
    assert src.replayed > 0


# -- Redis Streams -------------------------------------------------------------------------------

def _stream_producer(url: str, first: int, n: int, rate: float, want: dict[str, list[float]],
                     cluster: bool = False) -> threading.Thread:
    """XADD entries ``first`` .. ``first + n - 1`` with explicit ids and WAIT for one replica,
    resending a batch until WAIT confirms it (an id that is already there is refused as not
    above the stream's top: nothing doubles). ``rate`` 0: as fast as Redis takes them."""
    now = T0_MS

    def run() -> None:
        client = connect(url, cluster=cluster, timeout_ms=2000)
        if cluster:  # the stream's node, WAIT on the connection that wrote
            client = client.get_node_from_key(STREAM).redis_connection
        i = first
        t0 = time.monotonic()
        while i < first + n:
            top = min(i + 200, first + n)
            try:
                pipe = client.pipeline(transaction=False)
                for j in range(i, top):
                    card = f"c{j % 37}"
                    pipe.xadd(STREAM, {"d": orjson.dumps({
                        "card_id": card, "amount": round((j * 7919 % 1000) / 7.0, 3),
                        "merchant": f"m{j % 11}", "ts": now})}, id=f"{now}-{j + 1}")
                pipe.execute_command("WAIT", 1, 200)
                replies = pipe.execute(raise_on_error=False)
            except redis.RedisError:
                time.sleep(0.05)
                continue
            bad = [r for r in replies[:-1] if isinstance(r, Exception)
                   and "equal or smaller" not in str(r)]
            if bad or isinstance(replies[-1], Exception) or int(replies[-1]) < 1:
                time.sleep(0.05)
                continue  # not on a replica yet: the same batch again
            i = top
            ahead = (i - first) / rate - (time.monotonic() - t0) if rate else 0
            if ahead > 0:
                time.sleep(ahead)

    for j in range(first, first + n):
        cnt = want.setdefault(f"c{j % 37}", [0, 0.0])
        cnt[0] += 1
        cnt[1] += round((j * 7919 % 1000) / 7.0, 3)
    return threading.Thread(target=run, daemon=True)


def _stream_cards(client: Any) -> dict[str, list[float]]:
    """The brute force of the stream as Redis holds it now."""
    out: dict[str, list[float]] = {}
    for _, fields in client.xrange(STREAM):
        ev = orjson.loads(fields[b"d"])
        cnt = out.setdefault(ev["card_id"], [0, 0.0])
        cnt[0] += 1
        cnt[1] += ev["amount"]
    return out


@pytest.mark.slow
def test_redis_streams_across_a_sentinel_failover(sentinel: SentinelGroup) -> None:
    from redline.monitoring.joinstore_redis import RedisBackend
    from redline.serving.predict.sessions import RedisSessionStore

    store = RedisStore(sentinel.url, timeout_ms=10_000)
    sessions = RedisSessionStore(connect(sentinel.url, timeout_ms=2000), sentinel.url)
    join = RedisBackend(sentinel.url)
    sessions.update("s1", {"clicks": 1.0})
    join.count_unmatched("m", 1)
    want: dict[str, list[float]] = {}
    _stream_producer(sentinel.url, 0, SENTINEL_BACKLOG, 0, want).run()  # on the replica too
    producer = _stream_producer(sentinel.url, SENTINEL_BACKLOG, 1000, 500.0, want)
    cons = StreamConsumer(load_definitions(DEFS), store, stream=STREAM, group="g",
                          consumer="c1", batch=20)
    old = sentinel.primary
    client = connect(sentinel.url, timeout_ms=2000)
    with Ingesting(cons) as ing:
        producer.start()
        _wait("the consumer applying", lambda: cons.counts.accepted >= 1500)
        lost = WritesLost(old, sentinel.replica).start()
        # entries a producer adds without WAIT now: acknowledged, and gone with the primary
        unconfirmed = [client.xadd("events:unconfirmed", {"d": b"x"}) for _ in range(20)]
        mark = cons.counts.accepted
        _wait("applied on the primary alone", lambda: cons.counts.accepted >= mark + 500)
        assert cons.counts.accepted < SENTINEL_BACKLOG, \
            "the backlog was applied before the failover"
        lost.failover()
        new = sentinel.wait_failover(old)
        # the producer's WAIT needs a replica again: the old primary comes back as the new
        # one's replica, as a deployment's start script asks the sentinels where to sync from
        sentinel.rejoin(old, new)
        producer.join(60)
        total = sum(n for n, _ in want.values())
        _wait("every entry in the store", lambda: _counted(store, want) >= total, 60)
        _wait("nothing pending", lambda: client.xpending(STREAM, "g")["pending"] == 0)
        time.sleep(0.3)
    assert ing.outages
    # the producer's resends after the failover: every entry in the stream once
    assert {c: n for c, (n, _) in _stream_cards(client).items()} == \
        {c: n for c, (n, _) in want.items()}
    _assert_exact(store, want)  # 0 lost, 0 doubled
    assert unconfirmed and client.xlen("events:unconfirmed") == 0  # lost without WAIT
    # the session store and the label join were made before the failover and follow it
    assert sessions.update("s1", {"clicks": 1.0}).counters["clicks"] >= 1.0
    join.count_unmatched("m", 1)
    assert join.unmatched("m") >= 1


@pytest.mark.slow
def test_redis_streams_across_a_cluster_failover_with_wait(cluster: ReplicatedCluster) -> None:
    store = RedisStore(cluster.url, cluster=True, timeout_ms=10_000, wait_replicas=1,
                       wait_timeout_ms=200)
    stream_slot = store.client.keyslot(STREAM)
    stream_node = store.client.nodes_manager.get_node_from_slot(stream_slot)
    victim = next(p for p in cluster.primaries() if p.port != stream_node.port)  # tiles only
    replica = cluster.replica_of(victim)
    want: dict[str, list[float]] = {}
    _stream_producer(cluster.url, 0, BACKLOG, 0, want, cluster=True).run()  # a backlog
    producer = _stream_producer(cluster.url, BACKLOG, 1000, 500.0, want, cluster=True)
    cons = StreamConsumer(load_definitions(DEFS), store, stream=STREAM, group="g",
                          consumer="c1", batch=20)
    with Ingesting(cons) as ing:
        producer.start()
        _wait("the consumer applying", lambda: cons.counts.accepted >= 1500)
        lost = WritesLost(victim, replica).start()
        time.sleep(0.3)  # writes to the victim's shard wait for a replica that does not answer
        assert cons.counts.accepted < BACKLOG, "the backlog was applied before the failover"
        lost.failover()
        cluster.wait_failover(victim, replica)
        # with one replica per primary and WAIT for one, the shard takes ingest writes again
        # once it has a replica: the old primary comes back as the new one's replica
        victim.restart()
        producer.join(60)
        total = sum(n for n, _ in want.values())
        _wait("every entry in the store", lambda: _counted(store, want) >= total, 90)
        time.sleep(0.3)
    assert any("replica(s) acknowledged" in m for m in ing.outages), ing.outages[:3]
    _assert_exact(store, want)  # 0 lost, 0 doubled
    assert np.isfinite(_online(store, sorted(want))[1]).all()
