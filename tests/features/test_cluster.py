"""Redis Cluster: reads of many entities of two entity types (the fraud example's card and
merchant) are exact, one script call per (entity type, slot) and one pipeline per shard; a
cluster failure is ``StoreUnavailable``, never a raw redis-py exception."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pytest

from redline.errors import StoreUnavailable
from redline.features import Ingestor, MemoryStore, load_definitions
from redline.features.online.redis import RedisStore

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

ROOT = Path(__file__).resolve().parents[2]
FRAUD = ROOT / "examples" / "fraud" / "features.py"
T0 = 1_767_225_600_000


def _fraud_events(n: int = 1200) -> tuple[list[dict], list[int]]:
    rng = random.Random(4)
    out, arrivals = [], []
    for i in range(n):
        ts = T0 + i * 200
        card, merchant = f"card{rng.randrange(60)}", f"m{rng.randrange(25)}"
        amount = round(rng.uniform(1, 900), 2)
        out += [{"source": "card_txns", "card_id": card, "amount": amount, "ts_s": ts / 1000,
                 "ts": ts},
                {"source": "merchant_txns", "merchant_id": merchant, "amount": amount, "ts": ts},
                {"source": "merchant_labels", "merchant_id": merchant,
                 "is_fraud": float(rng.random() < 0.1), "ts": ts}]
        arrivals += [ts + 5] * 3
    return out, arrivals


def test_fraud_example_reads_two_entities_of_many_rows_on_a_cluster(redis_cluster) -> None:
    defs = load_definitions(FRAUD)
    events, arrivals = _fraud_events()
    # a long timeout for the bulk writes: redis-py retries a timed-out call, and a plain write
    # is not idempotent (the exactly-once paths are)
    mem, red = MemoryStore(), RedisStore(redis_cluster.url, cluster=True, timeout_ms=10_000)
    for store in (mem, red):
        ing = Ingestor(defs, store)
        for i in range(0, len(events), 300):
            ing.ingest(events[i:i + 300], arrivals[i:i + 300])
    views = [defs.view(v) for v in ("card_activity", "merchant_activity", "merchant_risk")]
    now = arrivals[-1] + 1
    rng = random.Random(1)
    for n in (1, 2, 10, 50):
        ids = {"card": [f"card{rng.randrange(70)}" for _ in range(n)],
               "merchant": [f"m{rng.randrange(30)}" for _ in range(n)]}
        a, ma = mem.reader(views).read(ids, now, dtype=np.float64)
        b, mb = red.reader(views).read(ids, now, dtype=np.float64)
        assert (ma == mb).all()
        assert np.allclose(a, b, rtol=1e-9, equal_nan=True), n
    # the rows really span shards and both hash tags of a row differ
    slots = {red.client.keyslot(f"rl:{{card:card{i}}}:x") for i in range(60)}
    assert len({red.client.nodes_manager.get_node_from_slot(s).name for s in slots}) == 3


class _Monitor:
    """``MONITOR`` on each node: the commands clients send it (a script's own calls left
    out), until :meth:`stop`."""

    def __init__(self, ports: list[int]) -> None:
        import threading

        import redis as redis_py

        self.ports = ports
        self.sent: dict[int, list[str]] = {p: [] for p in ports}
        self._stoppers = [redis_py.Redis(port=p) for p in ports]
        for stopper in self._stoppers:
            stopper.ping()  # connected before the watch starts: its handshake is not seen
        self._threads = []
        for port in ports:
            ready = threading.Event()
            thread = threading.Thread(target=self._watch, args=(redis_py.Redis(port=port),
                                                                port, ready), daemon=True)
            thread.start()
            assert ready.wait(10)
            self._threads.append(thread)

    def _watch(self, node, port: int, ready) -> None:  # type: ignore[no-untyped-def]
        with node.monitor() as m:
            ready.set()
            while True:
                cmd = m.next_command()
                if cmd["command"] == "ECHO monitor-stop":
                    return
                if cmd["client_type"] != "lua":
                    self.sent[port].append(cmd["command"].split()[0].upper() + (
                        " " + cmd["command"].split()[1].upper()
                        if cmd["command"].upper().startswith("SCRIPT") else ""))

    def stop(self) -> dict[int, list[str]]:
        for stopper in self._stoppers:
            stopper.echo("monitor-stop")
            stopper.close()
        for thread in self._threads:
            thread.join(10)
        return self.sent


def test_a_cluster_read_is_one_pipeline_of_evalsha_per_shard(redis_cluster) -> None:
    """Every node a read reaches gets its script calls and nothing else (no SCRIPT EXISTS
    first: one round trip); a node that lost its scripts is answered by a load and a retry."""
    import redis as redis_py

    defs = load_definitions(FRAUD)
    events, arrivals = _fraud_events(300)
    red = RedisStore(redis_cluster.url, cluster=True, timeout_ms=10_000)
    Ingestor(defs, red).ingest(events, arrivals)
    views = [defs.view(v) for v in ("card_activity", "merchant_activity", "merchant_risk")]
    reader = red.reader(views)
    ids = {"card": [f"card{i}" for i in range(40)], "merchant": [f"m{i % 25}" for i in range(40)]}
    now = arrivals[-1] + 1
    # the scripts loaded where they run; the values (exact: the test above) to read again
    want, want_missing = reader.read(ids, now, dtype=np.float64)
    assert not want_missing.all()
    for flushed in (False, True):
        if flushed:
            for port in redis_cluster.ports:
                with redis_py.Redis(port=port) as node:
                    node.script_flush()  # as a restarted node: every script lost
        monitor = _Monitor(redis_cluster.ports)
        got, missing = reader.read(ids, now, dtype=np.float64)
        sent = monitor.stop()
        assert (missing == want_missing).all()
        assert np.allclose(got, want, rtol=1e-9, equal_nan=True)
        for commands in sent.values():
            calls = commands.count("EVALSHA")
            assert calls > 0, sent
            if not flushed:
                assert set(commands) == {"EVALSHA"}, sent  # one pipeline, nothing before it
            else:  # each call NOSCRIPT, each script loaded once, each call made again
                loads = commands.count("SCRIPT LOAD")
                assert set(commands) == {"EVALSHA", "SCRIPT LOAD"} and 0 < loads <= 2, sent
                assert commands[:calls // 2] == ["EVALSHA"] * (calls // 2), sent


def test_stream_ingest_at_a_cluster_node_without_the_flag_is_a_clear_error(redis_cluster) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-m", "redline.cli", "ingest", "redis-stream", "-d", str(FRAUD),
         "--redis-url", redis_cluster.url, "--max-events", "1", "--stats-every", "0"],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "MovedError" not in proc.stderr
    assert "redis_cluster: true" in proc.stderr


def test_redis_stream_ingest_on_a_cluster_survives_sigkill_exactly_once(redis_cluster,
                                                                         tmp_path) -> None:
    """Consumers killed mid-stream and restarted; claims move entries between them; the online
    values on the cluster equal the brute force: the keys skip entry ids they already applied."""
    import signal

    import redis as redis_py

    from tests.features.test_ingest_stream import DEFS, STREAM, _consumer, _produce

    cfg = tmp_path / "redline.yaml"
    cfg.write_text(f"features:\n  store: redis\n  redis_url: {redis_cluster.url}\n"
                   "  redis_cluster: true\n")
    client = redis_py.RedisCluster.from_url(redis_cluster.url)
    expected, bad = _produce(client, 6_000)
    total = 6_000 + bad

    def wait(pred, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.02)

    stats = f"{STREAM}:stats"

    def processed() -> int:
        got = client.hgetall(stats)
        return int(got.get(b"accepted", 0)) + int(got.get(b"dead", 0))

    a = _consumer(redis_cluster.url, "A", "--config", str(cfg))
    wait(lambda: processed() > 1_000)
    a.send_signal(signal.SIGKILL)
    a.wait(10)
    b = _consumer(redis_cluster.url, "B", "--config", str(cfg), "--claim-idle-ms", "200")
    wait(lambda: processed() > 3_000)
    b.send_signal(signal.SIGKILL)
    b.wait(10)
    a2 = _consumer(redis_cluster.url, "A", "--config", str(cfg), "--claim-idle-ms", "200")
    try:
        wait(lambda: client.xpending(STREAM, "g")["pending"] == 0 and processed() >= total)
        time.sleep(0.5)
    finally:
        a2.send_signal(signal.SIGTERM)
        a2.communicate(timeout=30)
    defs = load_definitions(DEFS)
    reader = RedisStore(redis_cluster.url, cluster=True, timeout_ms=5000).reader(
        [defs.view("card_stats")], ["card_stats:count_1h", "card_stats:amount_sum_1h"])
    cards = sorted(expected)
    values, missing = reader.read(cards, dtype=float)
    assert not missing.any()
    wrong = {c: (v[0], expected[c][0]) for c, v in zip(cards, values, strict=True)
             if v[0] != expected[c][0]}
    assert wrong == {}  # 0 lost, 0 doubled
    for c, v in zip(cards, values, strict=True):
        assert v[1] == pytest.approx(expected[c][1], rel=1e-12)


def test_a_cluster_outage_is_store_unavailable(redis_cluster) -> None:
    defs = load_definitions(FRAUD)
    red = RedisStore(redis_cluster.url, cluster=True, timeout_ms=200)
    reader = red.reader([defs.view("card_activity"), defs.view("merchant_risk")])
    reader.read({"card": ["a", "b"], "merchant": ["x", "y"]}, T0)
    redis_cluster.kill()
    with pytest.raises(StoreUnavailable):
        reader.read({"card": ["a", "b"], "merchant": ["x", "y"]}, T0)
