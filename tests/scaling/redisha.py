"""Redis that survives its primary: real ``redis-server`` processes on free ports.

* :class:`SentinelGroup` — a primary, a replica and three sentinels (``redis-server --sentinel``)
  watching service ``rl``; :attr:`SentinelGroup.url` is the ``redis+sentinel://`` URL a user
  writes in ``redline.yaml``.
* :class:`ReplicatedCluster` — a Redis Cluster of three primaries, each with one replica.

Both can make a primary *lose* writes it acknowledged (:class:`WritesLost`): the replica is
stopped (SIGSTOP), a value larger than the sockets' buffers is written to the primary, so that
every later write stays queued in the primary's own memory, then the primary is SIGKILLed and
the replica continued. What the primary acknowledged after the large value never reached the
replica: the asynchronous-replication loss a real failover can have, made certain.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from tests.conftest import REDIS_CLI, REDIS_SERVER, RedisServer, free_cluster_port, free_port

SERVICE = "rl"
# a replica's first sync starts at once (redis-server waits 5 s for more replicas by default)
FAST_SYNC = ["--repl-diskless-sync-delay", "0"]


def wait_until(what: str, done: Callable[[], Any], timeout: float = 30.0,
               every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = done()
        except (redis.RedisError, OSError):
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout:.0f} s")
        time.sleep(every)


class WritesLost:
    """From :meth:`start` on, what ``primary`` acknowledges never reaches ``replica`` (see the
    module doc); :meth:`failover` SIGKILLs the primary and lets the replica go on."""

    JUNK_BYTES = 48 << 20  # more than loopback's socket buffers (a few MB each way)

    def __init__(self, primary: RedisServer, replica: RedisServer, host: str = "127.0.0.1"):
        self.primary, self.replica, self.host = primary, replica, host

    def start(self) -> WritesLost:
        assert self.replica.proc is not None
        self.replica.proc.send_signal(signal.SIGSTOP)
        c = redis.Redis(host=self.host, port=self.primary.port, socket_timeout=10)
        try:
            c.set("redline-test:junk", b"x" * self.JUNK_BYTES)
            c.delete("redline-test:junk")
        finally:
            c.close()
        return self

    def failover(self) -> None:
        assert self.replica.proc is not None
        self.primary.kill()
        self.replica.proc.send_signal(signal.SIGCONT)


class Sentinel:
    """One ``redis-server --sentinel`` process."""

    def __init__(self, workdir: Path, monitor: tuple[str, int], host: str = "127.0.0.1",
                 down_after_ms: int = 500, prefix: list[str] | None = None) -> None:
        self.workdir, self.monitor, self.host = workdir, monitor, host
        self.down_after_ms = down_after_ms
        self.prefix = prefix or []
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Sentinel:
        assert REDIS_SERVER
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "sentinel.conf"  # sentinels rewrite their file: a fresh one
        conf.write_text(
            f"port {self.port}\nbind {self.host}\ndir {self.workdir}\n"
            f"logfile {self.workdir / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} {self.monitor[0]} {self.monitor[1]} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} 4000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n")
        self.proc = subprocess.Popen([*self.prefix, REDIS_SERVER, str(conf), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(f"sentinel on {self.port} answering", lambda: redis.Redis(
            host=self.host, port=self.port, socket_timeout=0.5).ping(), timeout=10)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def master(self) -> tuple[str, int] | None:
        c = redis.Redis(host=self.host, port=self.port, socket_timeout=0.5,
                        decode_responses=True)
        try:
            got = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        finally:
            c.close()
        return (got[0], int(got[1])) if got else None


class SentinelGroup:
    """A primary, a replica and three sentinels (quorum 2), as ``redis+sentinel://``."""

    def __init__(self, workdir: Path, hosts: tuple[str, str, str] = ("127.0.0.1",) * 3) -> None:
        assert REDIS_SERVER, "redis-server is needed"
        self.workdir = workdir
        self.primary = RedisServer(workdir / "primary", extra=FAST_SYNC)
        self.replica = RedisServer(workdir / "replica")
        self.sentinels: list[Sentinel] = []
        self.hosts = hosts

    def start(self) -> SentinelGroup:
        self.primary.start()
        self.replica.extra = [*FAST_SYNC, "--replicaof", "127.0.0.1", str(self.primary.port)]
        self.replica.start()
        for i in range(3):
            self.sentinels.append(Sentinel(self.workdir / f"sentinel{i}",
                                           ("127.0.0.1", self.primary.port)).start())
        self.wait_synced()
        # every sentinel knows the replica and the two other sentinels before anything is killed
        wait_until("the sentinels knowing each other and the replica", self._acquainted)
        return self

    def _acquainted(self) -> bool:
        for s in self.sentinels:
            c = redis.Redis(host=s.host, port=s.port, socket_timeout=0.5, decode_responses=True)
            try:
                info = c.execute_command("SENTINEL", "MASTER", SERVICE)
                state = dict(zip(info[::2], info[1::2], strict=True)) if isinstance(
                    info, list) else info
                if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                    return False
            finally:
                c.close()
        return True

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def servers(self) -> list[RedisServer]:
        return [self.primary, self.replica]

    def current_primary(self) -> RedisServer:
        """The server the sentinels name as primary now."""
        addr = next(a for a in (s.master() for s in self.sentinels
                                if s.proc and s.proc.poll() is None) if a)
        return next(r for r in self.servers() if r.port == addr[1])

    def wait_synced(self, timeout: float = 20.0) -> None:
        """Until the primary reports its replica online and caught up."""
        def synced() -> bool:
            primary = self.current_primary()
            info = redis.Redis(port=primary.port, socket_timeout=1).info("replication")
            slave: Any = info.get("slave0")
            return bool(slave) and slave["state"] == "online" and \
                slave["offset"] >= info["master_repl_offset"]
        wait_until("the replica in sync", synced, timeout)

    def wait_failover(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Until every live sentinel names a primary other than ``old`` and it answers as one."""
        def promoted() -> RedisServer | None:
            addrs = {s.master() for s in self.sentinels if s.proc and s.proc.poll() is None}
            if len(addrs) != 1 or None in addrs or next(iter(addrs))[1] == old.port:  # type: ignore[index]
                return None
            new = self.current_primary()
            role = redis.Redis(port=new.port, socket_timeout=1).role()
            return new if role[0] in (b"master", "master") else None
        got: RedisServer = wait_until("a replica promoted", promoted, timeout)
        return got

    def rejoin(self, server: RedisServer, primary: RedisServer) -> None:
        """Start ``server`` again (empty) as ``primary``'s replica and wait until in sync."""
        server.extra = [*FAST_SYNC, "--replicaof", "127.0.0.1", str(primary.port)]
        server.restart()
        self.wait_synced()

    def kill(self) -> None:
        for s in self.sentinels:
            s.kill()
        for r in self.servers():
            r.kill()


class ReplicatedCluster:
    """A Redis Cluster of three primaries and three replicas (``--cluster-replicas 1``)."""

    def __init__(self, workdir: Path, node_timeout_ms: int = 1000) -> None:
        assert REDIS_SERVER and REDIS_CLI, "redis-server and redis-cli are needed"
        self.workdir = workdir
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisServer] = []

    def start(self) -> ReplicatedCluster:
        for i in range(6):
            self.nodes.append(RedisServer(self.workdir / f"n{i}", port=free_cluster_port(), extra=[
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms), *FAST_SYNC]).start())
        assert REDIS_CLI
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
             "--cluster-replicas", "1", "--cluster-yes"],
            check=True, capture_output=True, timeout=60)
        wait_until("the cluster ok with three replicas in sync", self._healthy, timeout=30)
        return self

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def _client(self, node: RedisServer) -> redis.Redis:
        return redis.Redis(port=node.port, socket_timeout=1, decode_responses=True)

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def primaries(self) -> list[RedisServer]:
        return [n for n in self.live() if self._client(n).role()[0] == "master"]

    def replica_of(self, primary: RedisServer) -> RedisServer:
        info = self._client(primary).info("replication")
        port = int(info["slave0"]["port"])
        return next(n for n in self.nodes if n.port == port)

    def _healthy(self) -> bool:
        live = self.live()
        for n in live:
            if self._client(n).cluster("info").get("cluster_state") != "ok":
                return False
        primaries = self.primaries()
        if len(primaries) != 3:
            return False
        for p in primaries:
            info = self._client(p).info("replication")
            slave = info.get("slave0")
            if not slave or slave["state"] != "online" or \
                    slave["offset"] < info["master_repl_offset"]:
                return False
        return True

    def wait_failover(self, dead: RedisServer, replica: RedisServer,
                      timeout: float = 30.0) -> RedisServer:
        """Until ``dead``'s ``replica`` is a primary and every live node reports the cluster
        ok."""
        def promoted() -> bool:
            if any(self._client(n).cluster("info").get("cluster_state") != "ok"
                   for n in self.live()):
                return False
            return self._client(replica).role()[0] == "master"
        wait_until("a cluster replica promoted", promoted, timeout)
        return replica

    def kill(self) -> None:
        for n in self.nodes:
            n.kill()
