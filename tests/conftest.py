"""Shared fixtures: real ``redis-server`` processes on free ports (killable, restartable), and
the log check every test runs under (``tests/logwatch.py``): an error or traceback a server
logs fails the test that was running, unless the test allows it by pattern."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.logwatch import WATCH, check_output, remove_logs, unexpected

# OpenMP (LightGBM, PyTorch, XGBoost, scikit-learn) keeps idle threads spinning by default. With
# pytest-xdist's workers (three) on two cores every parallel region is oversubscribed, and a thread
# spinning for its next task takes the core its partner needs to finish this one: LightGBM's
# 100-tree ranker of the recommend example took 2-9 s with passive waits and 2-24 s without,
# side by side on a busy machine. The same threads do the same work either way, so the results
# are the same. Set before any OpenMP runtime loads; child processes (servers, doc pages)
# inherit it, and an explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _share_httpx_default_tls() -> None:
    """httpx builds an SSL context for every client it makes, reading the whole CA bundle: about
    20 ms of CPU for each one-off ``httpx.get``/``post``, and the suite's readiness polls and
    load loops make thousands. Every server the suite talks to with httpx speaks plain HTTP, so
    the default context is made once and shared (a context is safe to share once made)."""
    try:
        import httpx._transports.default as transport
    except ImportError:  # another layout: pay the bundle per client
        return
    make = transport.create_ssl_context
    made: dict[tuple[object, ...], Any] = {}

    def shared(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None:
            return make(verify=verify, cert=cert, trust_env=trust_env)
        key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        if key not in made:
            made[key] = make(verify=True, cert=None, trust_env=trust_env)
        return made[key]

    transport.create_ssl_context = shared


_share_httpx_default_tls()

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


# Listening ports come from a block of this process's own, below the kernel's ephemeral range
# (32768-60999 on Linux). A port the kernel hands out for a bind to port 0 is an ephemeral one:
# between the pick and the server's bind, any client connection (the suite makes thousands) may
# take it as its local port, and the other xdist worker may pick it too ("Address already in
# use" in a server's log). Each xdist worker has its own block; within it a process starts at a
# random place (two processes outside xdist, a benchmark beside a test run, rarely meet) and
# goes round it, skipping ports something holds.
PORT_BLOCK = 3000
_FIRST_BLOCK = 17000  # blocks of 17000-31999: below the ephemeral range


def _port_block(worker: str) -> range:
    """The ports of xdist worker ``worker`` ("gw0", "gw1", ...; "" outside xdist)."""
    index = int(worker[2:]) + 1 if worker[:2] == "gw" and worker[2:].isdigit() else 0
    start = _FIRST_BLOCK + index % 5 * PORT_BLOCK
    return range(start, start + PORT_BLOCK)


def _port_cycle() -> Iterator[int]:
    import random

    block = _port_block(os.environ.get("PYTEST_XDIST_WORKER", ""))
    at = random.randrange(len(block))
    while True:
        yield block[at]
        at = (at + 1) % len(block)


_PORTS = _port_cycle()


def free_port() -> int:
    """A free port from this process's block, none handed out again before the block's other
    ports have been (the kernel may give one free port to two binds in a row: a test once got
    one port for both HTTP and gRPC)."""
    for _ in range(PORT_BLOCK):
        port = next(_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # held by something (or lingering after a server of this suite)
        return port
    raise RuntimeError(f"no free port among {PORT_BLOCK} of this process's block")


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    import random

    for _ in range(200):
        port = random.randint(20000, 45000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


def _ping(port: int, timeout: float = 10.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    import redis

    deadline = time.monotonic() + timeout
    client = redis.Redis(port=port, socket_connect_timeout=0.2, socket_timeout=0.5)
    try:
        while True:
            try:
                if client.ping():
                    return
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {port} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not answer PING in {timeout}s")
            time.sleep(0.02)
    finally:
        client.close()


class RedisServer:
    """One ``redis-server`` child; ``kill()`` is SIGKILL, ``restart()`` reuses the port."""

    def __init__(self, workdir: Path, port: int | None = None, extra: list[str] | None = None):
        self.workdir = workdir
        self.port = port or free_port()
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        assert REDIS_SERVER
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "redis.log"
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(log),
             *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            _ping(self.port, proc=self.proc)
        except RuntimeError as exc:
            self.kill()
            tail = log.read_text()[-500:] if log.exists() else ""
            raise RuntimeError(f"{exc}; log: {tail}") from None
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=5)

    def restart(self) -> None:
        self.kill()
        for _ in range(50):  # the port can linger for a moment after SIGKILL
            try:
                self.start()
                return
            except RuntimeError:
                time.sleep(0.1)
        raise RuntimeError(f"could not restart redis-server on port {self.port}")


def _need_redis() -> None:
    if REDIS_SERVER is None:
        pytest.skip("redis-server binary not found on PATH (install it: `make services`)")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh, empty redis-server for one test; always killed at teardown."""
    _need_redis()
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def redis_server_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server shared by a module's tests (flush between tests yourself if needed)."""
    _need_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.kill()


class RedisClusterNodes:
    def __init__(self, nodes: list[RedisServer]):
        self.nodes = nodes

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def kill(self) -> None:
        for n in self.nodes:
            n.kill()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """Three ``redis-server --cluster-enabled yes`` joined by ``redis-cli --cluster create``."""
    _need_redis()
    assert REDIS_CLI, "redis-cli is needed to create a cluster"
    base = tmp_path_factory.mktemp("cluster")
    nodes = []
    try:
        for i in range(3):
            nodes.append(RedisServer(base / f"n{i}", port=free_cluster_port(), extra=[
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000"]).start())
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=30,
        )
        import redis

        deadline = time.monotonic() + 15
        for n in nodes:
            c = redis.Redis(port=n.port)
            while c.cluster("info").get("cluster_state") != "ok":
                if time.monotonic() > deadline:
                    raise RuntimeError("redis cluster did not reach state ok")
                time.sleep(0.05)
            c.close()
        yield RedisClusterNodes(nodes)
    finally:
        for n in nodes:
            n.kill()


@pytest.fixture
def webhook_receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real local HTTP receiver of the alert webhook; what it got, in order."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    got: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()


ROOT = Path(__file__).resolve().parents[1]


def ingest_redis_stream(defs: Path | str | None, redis_url: str, stream: str, max_events: int,
                        cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``redline ingest redis-stream`` (group ``g``) until ``max_events``, as a user would
    (``defs`` None: without definitions); fail on a non-zero exit or an unexpected traceback in
    its log. Returns its stdout."""
    out = subprocess.run(
        [sys.executable, "-m", "redline.cli", "ingest", "redis-stream",
         *(["-d", str(defs)] if defs is not None else []),
         "--redis-url", redis_url, "--stream", stream, "--group", "g",
         "--max-events", str(max_events), "--stats-every", "0"],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
        capture_output=True, text=True, timeout=120, cwd=cwd)
    assert out.returncode == 0, out.stderr
    check_output(out.stderr, "redline ingest")
    return out.stdout


def keep_drift_thresholds(root: Path) -> dict[str, str | None]:
    """Calibrate every version's drift thresholds in the repository at ``root`` now and keep
    them beside it (``drift_thresholds.json``), as its first server with the default window
    would: for a repository that many tests copy and serve for a second or two each, whose
    servers would otherwise each start the same seconds-long calibration and stop before it
    ends (nothing kept). Returns where each ``model:version``'s came from ("file": already
    kept, "computed": made here)."""
    from redline.config import MonitoringSettings
    from redline.models import ModelRepository
    from redline.monitoring.drift import DriftMonitor

    defaults = MonitoringSettings()
    repo = ModelRepository(root)
    sources: dict[str, str | None] = {}
    for name in repo.list_models():
        for version in repo.versions(name):
            drift = DriftMonitor.of_version(name, str(version), repo.metadata(name, version),
                                            defaults, repo.version_dir(name, version))
            drift.calibrate(background=False)
            sources[f"{name}:{version}"] = drift.thresholds_from
    return sources


# A smaller `make demo`: the same steps and files, fewer rows and calls.
SMALL_DEMO_ARGS = ["--calls", "200", "--cards", "300", "--days", "4", "--replay", "200",
                   "--bench-seconds", "0.5"]


@dataclass(frozen=True)
class SmallDemo:
    project: Path  # a copy of the project in which the demo ran, as a reader's clone
    output: str  # what it printed (stdout, then stderr)


def project_files() -> list[str]:
    """What a fresh clone has: tracked files and new files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if (ROOT / line).is_file()]


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this run sees: the session's own, or with pytest-xdist the
    parent of the workers' folders (so a session fixture can be built once for all of them)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Held by one process of the run at a time (the others wait for it)."""
    import fcntl

    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def small_demo(tmp_path_factory: pytest.TempPathFactory) -> SmallDemo:
    """``make demo`` at a small size, once per run (shared by pytest-xdist's workers), in a copy
    of the project: the doc pages run in copies of it, and the demo's own tests read what it
    made and printed."""
    shared = _shared_dir(tmp_path_factory)
    base = shared / "small-demo" / "project"
    printed = shared / "small-demo" / "output.txt"
    with _exclusive(shared / "small-demo.lock"):
        if printed.is_file():  # another worker built it
            return SmallDemo(base, printed.read_text())
        if base.exists():  # a worker failed half-way: start again
            shutil.rmtree(base)
        for rel in project_files():
            target = base / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, target)
        (base / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
        env = {**os.environ, "PYTHONPATH": str(base / "src")}
        env.pop("REDLINE_CONFIG", None)
        done = subprocess.run([sys.executable, "-m", "redline.demo", *SMALL_DEMO_ARGS],
                              cwd=base, env=env, capture_output=True, text=True, timeout=300)
        output = done.stdout + done.stderr
        assert done.returncode == 0, (
            f"the demo failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        check_output(output, "make demo")
        printed.write_text(output)
    return SmallDemo(base, output)


# The log check (tests/logwatch.py) after each phase of each test.

_ALLOWED = pytest.StashKey[list[str]]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "allow_log(*patterns): errors and tracebacks this test provokes on purpose "
        "(regular expressions searched in each one's text); others fail the test")
    WATCH.install()


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config,
                                  items: list[pytest.Item]) -> Iterator[None]:
    """`make test` runs ``--dist loadgroup``: a test file goes to one worker whole (its module
    fixtures -- servers, trained models -- are made once), unless its tests name groups of their
    own (``xdist_group``), as the doc pages do: each page is minutes of child processes, and one
    worker running them all was the suite's critical path."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    yield
    _suffix_group_ids(config, items)


def _suffix_group_ids(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a loadgroup worker, after pytest-xdist's own hook: give each test id its group suffix
    (``path::test@group``, what the scheduler groups by) where that hook could not. pytest 9
    keeps a node's id in a structured ``_id`` and pytest-xdist 3.8 still writes the old
    ``_nodeid``: without this every test was scheduled alone, a file's tests were spread over
    both workers, and each worker started the file's servers, trained models and Spark's JVM
    again (pytest-dev/pytest-xdist#1386)."""
    if not getattr(config.option, "loadgroup", False):  # not a loadgroup worker
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # an older pytest: pytest-xdist's suffix took
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(groups)
        if groups and not item.nodeid.endswith(suffix) and isinstance(
                getattr(item, "_id", None), NodeId):
            item._id = NodeId.parse(item.nodeid + suffix)


# The longest groups first: the run ends when the slowest worker does, and a long
# group (a doc page, Spark's tests) drawn last leaves the others idle meanwhile. Each group's
# seconds are kept in pytest's cache (.pytest_cache) from the last run that ran it; groups without
# a measure go first (the doc pages among them first: each is one test, so pytest-xdist's own
# order, most tests first, would hand them out last), as in a fresh clone, CI's case.
_GROUP_SECONDS = "redline/group-seconds"


def _longest_first(group: str, last: dict[str, float]) -> tuple[int, float]:
    if group in last:
        return 1, -last[group]
    return 0, 0.0 if group.startswith("page:") else 1.0


def _group_of(nodeid: str) -> str:
    """A test's unit of work under ``--dist loadgroup``: its group, from the id's suffix."""
    return nodeid.rsplit("@", 1)[1] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    cache = getattr(config, "cache", None)  # None: -p no:cacheprovider
    if getattr(config.option, "dist", None) != "loadgroup" or cache is None:
        return None
    from xdist.scheduler import LoadGroupScheduling

    last: dict[str, float] = cache.get(_GROUP_SECONDS, {})

    class LongestFirst(LoadGroupScheduling):
        ordered = False

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the first assignment: the queue is complete
                self.ordered = True
                units = sorted(self.workqueue.items(),
                               key=lambda unit: _longest_first(unit[0], last))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


_seconds: defaultdict[str, float] = defaultdict(float)  # by group; the controller sees all


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[_group_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if getattr(session.config.option, "dist", None) == "loadgroup" and _seconds and cache:
        measured = {group: round(s, 2) for group, s in _seconds.items()}
        cache.set(_GROUP_SECONDS, {**cache.get(_GROUP_SECONDS, {}), **measured})


def pytest_unconfigure(config: pytest.Config) -> None:
    remove_logs()


def _allowed(item: pytest.Item) -> list[str]:
    patterns = item.stash.setdefault(_ALLOWED, [])
    for mark in item.iter_markers("allow_log"):
        patterns.extend(p for p in mark.args if p not in patterns)
    return patterns


def _unexpected_logs(item: pytest.Item, phase: str) -> str:
    bad = unexpected(WATCH.take(), _allowed(item))
    if not bad:
        return ""
    counts = Counter(bad)  # a warm-up or a load repeats the same one many times
    shown = "\n\n".join(f"{f} (x{n})" if n > 1 else str(f)
                         for f, n in list(counts.items())[:5])
    more = f"\n\n... and {len(counts) - 5} more kinds" if len(counts) > 5 else ""
    return (f"{len(bad)} unexpected error(s) or traceback(s) logged during {phase} (a bug to "
            "fix; if the test provokes it on purpose, allow it with "
            f"@pytest.mark.allow_log(pattern) or the allow_log fixture):\n{shown}{more}")


def _checked(item: pytest.Item, phase: str) -> Iterator[None]:
    try:
        yield
    except BaseException as exc:
        # the phase failed anyway: what was logged meanwhile is context for its failure
        problem = _unexpected_logs(item, phase)
        if problem:
            exc.add_note(problem)
        raise
    problem = _unexpected_logs(item, phase)
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _checked(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _checked(item, "the test"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _checked(item, "teardown"))


@pytest.fixture
def allow_log(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``allow_log(pattern, ...)``: errors and tracebacks this test provokes on purpose."""

    def allow(*patterns: str) -> None:
        _allowed(request.node).extend(patterns)

    return allow
