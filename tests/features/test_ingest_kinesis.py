"""Kinesis ingest against kinesalite (Kinesis's API on LevelDB): dead letters with reasons,
sequence numbers beyond 2^53 kept exactly, exactly-once effect through replays, a SIGKILL, a
restart and a shard split mid-stream, throttled reads and expired iterators retried; on one
Redis and on a 3-node Redis Cluster. Final online values equal a brute-force count of what was
put."""

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

from redline.cli import main
from redline.features import load_definitions
from redline.features.ingest.kinesis import (
    SHARD_END,
    KinesisSource,
    checkpoint_key,
    dead_letter_key,
)
from redline.features.online.redis import RedisStore
from tests.features.kinesalite import REGION, Kinesalite
from tests.logwatch import LoggedPopen

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

ROOT = Path(__file__).resolve().parents[2]
DEFS = str(Path(__file__).with_name("defs_tx.py"))
BAD = [b"{not json", orjson.dumps({"card_id": "c1", "ts": 1}),
       orjson.dumps({"card_id": "c1", "amount": "12", "merchant": "m", "ts": 0}),
       orjson.dumps({"card_id": "c1", "amount": 1.0, "merchant": "m", "ts": "yesterday"}),
       b"\xff\xfe not utf-8"]
AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": REGION}


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in AWS.items():
        monkeypatch.setenv(key, value)


def _put(kin: Kinesalite, stream: str, n: int, *, seed: int, bad_every: int = 0,
         rate: float = 0.0, want: dict[str, list[float]] | None = None,
         until: threading.Event | None = None) -> tuple[dict[str, list[float]], int]:
    """Put ``n`` good events keyed by card (and a bad one every ``bad_every``), and on at
    ``rate`` until ``until`` is set when it is given (the stream flows for as long as a kill,
    restart and split take, however slow the machine); returns the brute-force (count, sum) per
    card and the number of bad records. Failed records of a PutRecords are put again, as a
    producer does."""
    client = kin.client()
    rng = random.Random(seed)
    want = {} if want is None else want
    bad = 0
    t0 = time.monotonic()
    pending: list[dict[str, Any]] = []

    def send() -> None:
        nonlocal pending
        while pending:
            got = client.put_records(StreamName=stream, Records=pending)
            pending = [r for r, res in zip(pending, got["Records"], strict=True)
                       if "ErrorCode" in res]
            if pending:
                time.sleep(0.05)

    i = 0
    while i < n or (until is not None and not until.is_set() and i < 50 * n):
        card = f"c{rng.randrange(200)}"
        amount = round(rng.uniform(1, 500), 2)
        cnt = want.setdefault(card, [0, 0.0])
        cnt[0] += 1
        cnt[1] += amount
        ev = {"card_id": card, "amount": amount, "merchant": f"m{rng.randrange(30)}",
              "ts": int(time.time() * 1000) - rng.randint(0, 2000)}
        pending.append({"Data": orjson.dumps(ev), "PartitionKey": card})
        if bad_every and i % bad_every == 0:
            pending.append({"Data": BAD[bad % len(BAD)], "PartitionKey": "c1"})
            bad += 1
        if len(pending) >= 100:
            send()
            if rate:
                ahead = i / rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        i += 1
    send()
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


def _source(kin: Kinesalite, store: RedisStore, stream: str, **kw: Any) -> KinesisSource:
    return KinesisSource(load_definitions(DEFS), store, stream=stream, region=REGION,
                         endpoint_url=kin.endpoint, **kw)


def _drain(src: KinesisSource, total: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while src.counts.accepted + src.counts.dead < total:
        assert time.monotonic() < deadline, src.stats()
        src.poll()


def test_kinesis_dead_letters_and_replays_exactly_once(kinesalite, redis_server) -> None:
    kinesalite.create_stream("tx1", 4)
    want, bad = _put(kinesalite, "tx1", 3000, seed=1, bad_every=97)
    store = RedisStore(redis_server.url, timeout_ms=10_000)
    src = _source(kinesalite, store, "tx1", batch=250)
    _drain(src, 3000 + bad)
    assert (src.counts.accepted, src.counts.dead) == (3000, bad)
    assert set(src.counts.by_reason) >= {"unparseable", "missing", "field"}
    _assert_exact(store, want)
    dead = {k.decode(): orjson.loads(v)
            for k, v in store.client.hgetall(dead_letter_key("tx1")).items()}
    assert len(dead) == bad and all(d["reason"] for d in dead.values())
    assert any(d["event"] == "{not json" and d["reason"].startswith("unparseable")
               for d in dead.values())
    # each shard's checkpoint is its last sequence number, exactly (56 digits, beyond 2^53)
    marks = {k.decode(): v.decode() for k, v in
             store.client.hgetall(checkpoint_key("tx1")).items()}
    assert set(marks) == set(src.shards) and all(len(m) > 16 for m in marks.values())
    assert marks == {s.id: s.applied for s in src.shards.values()}
    src.close()
    # a crash before any checkpoint was stored looks like this: everything is read again into
    # the same store, and the marks kept with the tiles skip all of it
    store.client.delete(checkpoint_key("tx1"))
    again = _source(kinesalite, store, "tx1", batch=333)
    _drain(again, 3000 + bad)
    again.close()
    _assert_exact(store, want)
    assert len(store.client.hgetall(dead_letter_key("tx1"))) == bad
    # a restart reads on from the checkpoints: nothing more to read
    resumed = _source(kinesalite, store, "tx1")
    for _ in range(3):
        assert resumed.poll() == 0
    resumed.close()


def test_sequence_numbers_beyond_2_53_are_compared_exactly(redis_server) -> None:
    """Two sequence numbers one apart at 56 digits are the same double: kept as decimal
    strings, the later one applies and a replay of either is skipped."""
    from redline.features.events import EventDecoder, store_key

    defs = load_definitions(DEFS)
    store = RedisStore(redis_server.url, timeout_ms=10_000)
    decoder = EventDecoder(defs, None)
    seq = 49680882619851927009972139835916289027660870085918064642
    assert float(seq) == float(seq + 1)
    now = int(time.time() * 1000)
    event = orjson.dumps({"card_id": "big", "amount": 2.0, "merchant": "m", "ts": now})

    def apply(*seqs: int) -> None:
        batch = decoder.decode([event] * len(seqs), now)
        store.write_sequenced("s", [("shardId-000000000000", str(q)) for q in seqs], batch)

    apply(seq)
    apply(seq + 1)  # the next record: applied
    apply(seq, seq + 1)  # a replay of both: skipped
    apply(seq + 2, seq + 1)  # a new one applies; the replayed one after it does not
    counts, sums = _online(store, ["big"])
    assert (int(counts[0]), sums[0]) == (3, 6.0)
    key = store_key("card", "big", "transactions")
    mark = store.client.hget(key, "@k:s:shardId-000000000000").decode()
    assert mark.lstrip("0") == str(seq + 2) and len(mark) == 129


def test_throttled_reads_and_expired_iterators_are_retried(kinesalite, redis_server) -> None:
    kinesalite.create_stream("faults", 2)
    want, _ = _put(kinesalite, "faults", 1000, seed=3)
    store = RedisStore(redis_server.url, timeout_ms=10_000)
    src = _source(kinesalite, store, "faults", batch=100)
    kinesalite.throttle(1.5)
    t0 = time.monotonic()
    while src.counts.accepted == 0:
        assert time.monotonic() - t0 < 30, src.stats()
        src.poll()
    # every read was refused for 1.5 s, each shard backed off and tried again
    assert src.throttled >= 2 and time.monotonic() - t0 >= 1.0
    kinesalite.jump_clock(301_000)  # every iterator handed out so far is now expired
    more, _ = _put(kinesalite, "faults", 500, seed=4, want=want)
    _drain(src, 1500)
    assert src.expired_iterators >= 2  # one per shard
    _assert_exact(store, want)
    assert src.errors == 0
    src.close()


def test_behind_latest_per_shard_is_in_the_metrics(kinesalite, redis_server) -> None:
    from redline.monitoring.ingest import IngestMetrics, MeteredSource

    kinesalite.create_stream("lag", 3)
    _put(kinesalite, "lag", 300, seed=5)
    kinesalite.behind(1500)
    try:
        src = _source(kinesalite, RedisStore(redis_server.url, timeout_ms=10_000), "lag")
        metrics = IngestMetrics("lag")
        metered = MeteredSource(src, metrics)
        _drain(src, 300)
        metered.flush()  # a flush always samples
    finally:
        kinesalite.behind(0)
    got = {s.labels["partition"]: s.value for f in metrics.registry.collect() for s in f.samples
           if s.name == "redline_ingest_behind_latest_seconds"
           and s.labels == {**s.labels, "source": "kinesis", "stream_or_topic": "lag"}}
    assert got == {sid: 1.5 for sid in src.shards}
    assert {sid: st["behind_ms"] for sid, st in src.stats()["shards"].items()} == {
        sid: 1500 for sid in src.shards}
    src.close()


def _member(kin: Kinesalite, url: str, stream: str, name: str, *extra: str) -> LoggedPopen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **AWS)
    return LoggedPopen(
        [sys.executable, "-m", "redline.cli", "ingest", "kinesis", "-d", DEFS, "--redis-url", url,
         "--stream", stream, "--endpoint-url", kin.endpoint, "--batch", "200",
         "--stats-every", "0.2", *extra],
        source=f"ingest kinesis {name}", env=env, stdout=subprocess.PIPE, cwd=ROOT)


def _stats_lines(member: LoggedPopen) -> list[dict[str, Any]]:
    out = []
    for line in member.log_text().splitlines():
        if line.startswith("{"):
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:  # a line being written
                continue
    return out


def _wait_until(what: str, done: Any, members: list[LoggedPopen], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        for p in members:
            assert p.poll() is None, p.log_text()[-2000:]
        assert time.monotonic() < deadline, (
            f"not {what} in {timeout:.0f} s: {[(_stats_lines(p) or [{}])[-1] for p in members]}")
        time.sleep(0.1)


def _split(kin: Kinesalite, stream: str, shard: str) -> list[str]:
    """Split ``shard`` in the middle of its hash range; returns the two children's ids."""
    client = kin.client()
    shards = {s["ShardId"]: s for s in client.list_shards(StreamName=stream)["Shards"]}
    lo = int(shards[shard]["HashKeyRange"]["StartingHashKey"])
    hi = int(shards[shard]["HashKeyRange"]["EndingHashKey"])
    client.split_shard(StreamName=stream, ShardToSplit=shard,
                       NewStartingHashKey=str((lo + hi) // 2))
    kin.wait_active(stream)
    after = client.list_shards(StreamName=stream)["Shards"]
    return [s["ShardId"] for s in after if s.get("ParentShardId") == shard]


def _kill_and_split_test(kin: Kinesalite, store: RedisStore, url: str, stream: str,
                         extra: tuple[str, ...] = ()) -> None:
    """One reader on a 2-shard stream while events are put; it is SIGKILLed mid-stream and
    restarted; a shard is split while it reads (its parent drained before its children); at the
    end every card's count and sum equal the brute force: 0 lost, 0 doubled."""
    kin.create_stream(stream, 2)
    n = 1600  # at least (4 s at 400/s); on until the split is made, however slow the readers
    split = threading.Event()
    result: dict[str, Any] = {}

    def produce() -> None:
        result["want"], result["bad"] = _put(kin, stream, n, seed=7, rate=400.0, bad_every=501,
                                             until=split)

    producer = threading.Thread(target=produce)
    a = _member(kin, url, stream, "a", *extra)
    procs = [a]
    try:
        producer.start()
        _wait_until("reading", lambda: (_stats_lines(a) or [{}])[-1].get("accepted"), [a])
        assert producer.is_alive(), "the stream ended before the kill: not mid-stream"
        a.send_signal(signal.SIGKILL)  # mid-stream: a batch may be applied, not checkpointed
        a.wait(10)
        b = _member(kin, url, stream, "b", *extra)
        procs.append(b)
        _wait_until("the restarted reader applying", lambda: any(
            s.get("accepted") for s in _stats_lines(b)), [b])
        assert producer.is_alive(), "the stream ended before the split: not mid-stream"
        children = _split(kin, stream, "shardId-000000000000")
        split.set()
        assert len(children) == 2
        producer.join(120)
        want, bad = result["want"], result["bad"]
        n = sum(int(c) for c, _ in want.values())
        more, more_bad = _put(kin, stream, 1000, seed=8, want=want, bad_every=101)

        def caught_up() -> bool:
            stats = (_stats_lines(b) or [{}])[-1]
            shards = stats.get("shards", {})
            return (all(shards.get(c, {}).get("records") for c in children)
                    and int(_online(store, sorted(want))[0].sum()) >= n + 1000)

        _wait_until("the children read and every event applied", caught_up, [b], timeout=90)
        time.sleep(1.0)  # anything still being applied twice would land now
        _assert_exact(store, want)
        assert len(store.client.hgetall(dead_letter_key(stream))) == bad + more_bad
        assert a.returncode == -signal.SIGKILL
        # the parent was drained before a record of its children was applied
        for stats in _stats_lines(b):
            shards = stats.get("shards", {})
            if any(shards.get(c, {}).get("records") for c in children):
                assert shards["shardId-000000000000"]["state"] == "ended", stats
        marks = store.client.hgetall(checkpoint_key(stream))
        assert marks[b"shardId-000000000000"] == SHARD_END.encode()
        b.send_signal(signal.SIGTERM)
        out, _ = b.communicate(timeout=30)
        final = orjson.loads(out.decode().strip().splitlines()[-1])
        assert final["accepted"] > 0 and set(final["shards"]) >= set(children)
    finally:
        split.set()  # (a failure before the split: the producer stops too)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def test_kinesis_reader_killed_restarted_and_split_loses_and_doubles_nothing(
        kinesalite, redis_server) -> None:
    _kill_and_split_test(kinesalite, RedisStore(redis_server.url, timeout_ms=10_000),
                         redis_server.url, "tx-kill")


def test_kinesis_exactly_once_on_a_redis_cluster(kinesalite, redis_cluster, tmp_path) -> None:
    cfg = tmp_path / "redline.yaml"
    cfg.write_text(f"features:\n  store: redis\n  redis_url: {redis_cluster.url}\n"
                   "  redis_cluster: true\n")
    store = RedisStore(redis_cluster.url, cluster=True, timeout_ms=10_000)
    _kill_and_split_test(kinesalite, store, redis_cluster.url, "tx-cluster",
                         ("--config", str(cfg)))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_cli_errors_say_what_to_do(kinesalite, redis_server, capsys, monkeypatch) -> None:
    base = ("ingest", "kinesis", "-d", DEFS, "--endpoint-url", kinesalite.endpoint)
    code, text = _cli(capsys, *base, "--redis-url", redis_server.url, "--stream", "nope")
    assert code != 0 and "Kinesis stream 'nope' does not exist" in text
    assert "Traceback" not in text
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    code, text = _cli(capsys, *base, "--redis-url", redis_server.url, "--stream", "nope")
    assert code != 0 and "needs a region" in text and "--region" in text
    code, text = _cli(capsys, *base, "--redis-url", redis_server.url, "--stream", "nope",
                      "--region", REGION, "--endpoint-url", "http://127.0.0.1:9")
    assert code != 0 and "not reachable" in text and "Traceback" not in text
