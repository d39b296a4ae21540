"""redline vs FastAPI + Feast + ONNX Runtime on the same features, store and model, in one run.

The workload is the Feast peer's (``benchmarks/peers/feast/``): 100,000 cards, 5 feature views
of 8 float features each in Redis, one request = read the 40 features of one
card + run the same 100-tree gradient-boosting ONNX model. redline serves it as feature views of
``last`` values (one event per card carries the 40 values), read by its pipeline in one Lua
call; Feast reads its own materialized hashes (a pipeline of 5 HMGETs) inside the peer's FastAPI
app.

Both servers (and the do-nothing floor) are started at once, each pinned to CPU 0 with its own
redis-server pinned to CPU 1, where the load generator (redline's open-loop ``redline.bench``, the
same for every target) also runs. Every measurement is **interleaved**: short slices alternate
between the targets (A B B A ...) and each side's slices are merged into one latency histogram,
so noise from other work on this shared machine lands on every side alike instead of on
whichever ran second.

The same conditions for every target, in every slice:

* The targets not being measured are **stopped** (``SIGSTOP``, their redis-server too) and
  continued for their own slices: an idle server still wakes (redline's monitoring tick, Redis's
  cron), and it shares CPU 0 with the one being measured.
* The load generator waits for each send time on a ``timerfd`` (``LoadSpec.precise_timer``)
  instead of spinning, so it leaves CPU 1 to the redis-servers (a spinning one held it).
* ``--sched fifo`` (the default): the measured server, its redis-server and the load generator
  run ``SCHED_FIFO`` (server and Redis priority 50, the generator 40 so a Redis reply goes first),
  the nearest thing on a shared two-core machine to a core of their own: other processes
  cannot hold CPU 0 while the woken server waits for it. ``--sched none`` leaves the default
  scheduler.
  Every target, the floor included, gets the same policy and priorities.
* ``--idle-poll`` (the default): ``/dev/cpu_dma_latency`` is held at 0 for the run, so an idle
  CPU polls instead of halting. This machine is a VM whose halted vCPU costs a host round trip
  to wake (no guest halt polling); every wake-up of every party (the server on a request or a
  Redis reply, the generator on an answer) paid it, more often the more wake-ups a request
  needs. The usual low-latency setting (tuned's ``latency-performance``); it applies to the
  whole machine, so to every target alike.

The peer runs from its own environment (never a redline dependency), the ``feast`` peer of
``benchmarks/peers/``: made on first use (about four minutes) or ahead with ``bash
benchmarks/peers/setup.sh feast``, which also materializes its repository into Redis once and
keeps the snapshot. Each run serves a copy of that snapshot from a redis-server of its own.

    .venv/bin/python benchmarks/pipeline/feast_compare.py [--duration 10]

Prints one JSON document (every run) and a summary table.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for benchmarks
N_VIEWS, N_FEATS = 5, 8
FEAST_APP = Path(__file__).resolve().parents[1] / "peers" / "feast"  # the peer's app.py
LADDER = [125.0, 250.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 2500.0, 3000.0, 4000.0, 5000.0,
          6000.0, 8000.0]
DEFS = '''"""The Feast peer's 5 views x 8 features, as redline feature views of last values."""
from redline.features import Entity, EventSource, FeatureView, last

card = Entity("card", join_key="card")
FIELDS = [f"fv{v}_f{j}" for v in range(5) for j in range(8)]
cards = EventSource("cards", card, {f: float for f in FIELDS}, timestamp="ts")
VIEWS = [FeatureView(f"fv{v}", cards, [last(f"fv{v}_f{j}", "1d", name=f"fv{v}_f{j}")
                                       for j in range(8)]) for v in range(5)]
fv0, fv1, fv2, fv3, fv4 = VIEWS
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, path: str, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


# Scheduling of every target alike (``--sched``): None, or SCHED_FIFO priorities for the
# servers, their redis-servers and the load generator.
RT: dict[str, int] | None = None
RT_PRIORITIES = {"server": 50, "redis": 50, "loadgen": 40}


NICE = -20  # ``--sched nice``: the same parties at the highest CFS weight instead
SCHED = "fifo"


def sched_prefix(role: str) -> list[str]:
    """``chrt`` (or ``nice``) in front of a server's or a redis-server's command."""
    if SCHED == "nice":
        return ["nice", "-n", str(NICE)]
    return ["chrt", "-f", str(RT[role])] if RT else []


def start_redis(port: int, workdir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([*sched_prefix("redis"), "taskset", "-c", "1",
                             shutil.which("redis-server") or "redis-server",
                             "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc


class Target:
    """``pids``: the target's processes (server, its redis-server), stopped while others run."""

    def __init__(self, label: str, url: str, model: str, body: bytes, path: str | None,
                 pids: list[int] | None = None) -> None:
        self.label, self.url, self.model, self.body, self.path = label, url, model, body, path
        self.pids = pids or []


def _signal(targets: list[Target], sig: int) -> None:
    for t in targets:
        for pid in t.pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def cpu_s(pid: int) -> float:
    """CPU seconds a process (all its threads) has used."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measured_slice(t: Target, others: list[Target], spec: object) -> tuple[object, dict]:
    """One slice against ``t`` with every other target stopped, under ``RT`` if set; returns
    the result and the CPU each party used per second of the slice (load generator, server,
    its redis-server)."""
    from redline.bench.runner import run_load

    _signal(others, signal.SIGSTOP)
    _signal([t], signal.SIGCONT)
    time.sleep(0.05)
    before = [cpu_s(p) for p in t.pids]
    gen0 = _self_cpu_s()
    old = os.sched_getscheduler(0), os.sched_getparam(0)
    old_nice = os.getpriority(os.PRIO_PROCESS, 0)
    # A spinning generator stays in the default class: spinning at SCHED_FIFO would starve
    # everything else on CPU 1 (sched_yield only yields to its own priority).
    rt = RT if RT and getattr(spec, "precise_timer", False) else None
    if rt:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(rt["loadgen"]))
    elif SCHED == "nice":
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    try:
        res = run_load(spec)  # type: ignore[arg-type]
    finally:
        if rt:
            os.sched_setscheduler(0, old[0], old[1])
        elif SCHED == "nice":
            os.setpriority(os.PRIO_PROCESS, 0, old_nice)
    wall = res.elapsed_s + spec.warmup_s  # type: ignore[attr-defined]
    cpu = {"loadgen": (_self_cpu_s() - gen0) / wall}
    for name, pid, b in zip(("server", "redis"), t.pids, before, strict=False):
        cpu[name] = (cpu_s(pid) - b) / wall
    return res, cpu


def interleaved(targets: list[Target], rounds: int, slice_s: float,
                all_targets: list[Target] | None = None, **load: object) -> dict:
    """Alternate short slices between targets; merge each target's slices into one result.

    Every other target in ``all_targets`` is stopped during a target's slice. The load generator
    shares CPU 1 with the redis-servers, so it waits for send times on a timerfd
    (``precise_timer``) unless ``load`` says otherwise: the spin it used before held the core
    and delayed each Redis wake-up behind it by up to a scheduler slice (measured with
    ``tail_probe.py``: redis-server's wake-up delay p99 3.7 ms spinning, 25 us yielding), a
    cost of the measuring tool that landed on every Redis-backed server's tail and not on the
    floor's."""
    load = load or {}
    if not any(k in load for k in ("spin_yield", "precise_timer", "spin_s")):
        load = {"precise_timer": True, **load}
    from hdrh.histogram import HdrHistogram

    from redline.bench.runner import LoadSpec

    everyone = all_targets or targets
    runs: dict[str, list] = {t.label: [] for t in targets}
    cpus: dict[str, list[dict]] = {t.label: [] for t in targets}
    try:
        for r in range(rounds):
            for t in (targets if r % 2 == 0 else targets[::-1]):
                spec = LoadSpec(url=t.url, model=t.model, protocol="json", duration_s=slice_s,
                                warmup_s=0.5, v1_body=t.body, path=t.path,
                                **load)  # type: ignore[arg-type]
                res, cpu = measured_slice(t, [o for o in everyone if o is not t], spec)
                runs[t.label].append(res)
                cpus[t.label].append(cpu)
    finally:
        _signal(everyone, signal.SIGCONT)
    out = {}
    for label, results in runs.items():
        hist = HdrHistogram(1, 120_000_000, 3)
        errors: dict[str, int] = {}
        for res in results:
            hist.add(res.histogram)
            for k, v in res.errors.items():
                errors[k] = errors.get(k, 0) + v
        ok = sum(res.ok for res in results)
        elapsed = sum(res.elapsed_s for res in results)
        out[label] = {
            "rps": round(ok / elapsed, 1) if elapsed else 0.0, "ok": ok, "errors": errors,
            **{f"p{p:g}_ms": round(hist.get_value_at_percentile(p) / 1000.0, 3)
               for p in (50, 90, 99, 99.9)},
            "max_ms": round(hist.get_max_value() / 1000.0, 3),
            "slices_p99_ms": [round(res.percentile_ms(99), 3) for res in results],
            "slices_p50_ms": [round(res.percentile_ms(50), 3) for res in results],
            # CPU per second of slice (median over slices): what each party cost.
            "cpu_per_s": {k: round(float(np.median([c[k] for c in cpus[label] if k in c])), 3)
                          for k in cpus[label][0]} if cpus[label] else {},
        }
    return out


def compare(targets: list[Target], duration: float, cases: set[str] | None = None,
            rounds: int = 4, wait: str = "timer", ladder_rounds: int = 2) -> dict:
    """``cases``: which of c1, c8, open_500 and ladder to run (all by default); ``rounds``:
    interleaved slices per side and case (the duration is split over them); ``wait``: how the
    open-loop generator waits for a send time: ``timer`` (a timerfd, the default), ``yield``
    (spin, yielding the CPU every turn) or ``hog`` (spin holding the CPU)."""
    slice_s = max(1.0, duration / rounds)
    y: dict[str, object] = {"timer": {"precise_timer": True},
                            "yield": {"spin_yield": True}, "hog": {"spin_yield": False}}[wait]
    y = {**y, "all_targets": targets}
    out: dict = {}
    for name, load in (("c1", {"connections": 1}), ("c8", {"connections": 8}),
                       ("open_500", {"rate": 500.0, "connections": 64})):
        if cases is not None and name not in cases:
            continue
        out[name] = interleaved(targets, rounds, slice_s, **load, **y)
        print(name, {k: (v["rps"], v["p50_ms"], v["p99_ms"]) for k, v in out[name].items()},
              file=sys.stderr)
    if cases is not None and "ladder" not in cases:
        return out
    # The rate ladder, interleaved too; a side stops after two failed steps in a row.
    ladder: dict[str, list] = {t.label: [] for t in targets}
    misses = {t.label: 0 for t in targets}
    for rate in LADDER:
        live = [t for t in targets if misses[t.label] < 2]
        if not live:
            break
        step = interleaved(live, ladder_rounds, slice_s, rate=rate, connections=64, **y)
        for label, res in step.items():
            ok = res["p99_ms"] <= 5.0 and not res["errors"] and res["rps"] >= 0.95 * rate
            ladder[label].append({"rate": rate, "p50_ms": res["p50_ms"],
                                  "p99_ms": res["p99_ms"], "rps": res["rps"],
                                  "errors": res["errors"], "ok": ok})
            misses[label] = 0 if ok else misses[label] + 1
        print("ladder", rate, {k: v["p99_ms"] for k, v in step.items()}, file=sys.stderr)
    out["ladder"] = ladder
    out["max_rate_p99_le_5ms"] = {label: max([s["rate"] for s in steps if s["ok"]], default=0.0)
                                  for label, steps in ladder.items()}
    return out


def start_redline(args: argparse.Namespace, work: Path, procs: list, label: str = "redline",
                  src: str | None = None, env: dict[str, str] | None = None
                  ) -> tuple[Target, dict]:
    """Backfill a fresh redis-server with the peer's values, register the peer's model, serve
    (``src``: another redline tree's ``src/`` to serve instead, ``env``: settings overrides
    such as ``REDLINE_FEATURES__REDIS_LOOP_READS=false``, for before/after runs)."""
    work = work / label
    work.mkdir()
    from redline.features import load_definitions
    from redline.features.ingest import Ingestor
    from redline.features.online.redis import RedisStore
    from redline.models import ModelRepository

    defs_path = work / "feast_views.py"
    defs_path.write_text(DEFS)
    defs = load_definitions(defs_path)
    rport, hport = free_port(), free_port()
    procs.append(start_redis(rport, work))
    url = f"redis://127.0.0.1:{rport}/0"
    rng = np.random.default_rng(0)
    values = rng.standard_normal((args.cards, N_VIEWS * N_FEATS)).astype(np.float32)
    now = int(time.time() * 1000)
    fields = [f"fv{v}_f{j}" for v in range(N_VIEWS) for j in range(N_FEATS)]
    ing = Ingestor(defs, RedisStore(url, timeout_ms=30_000))
    t0 = time.perf_counter()
    for lo in range(0, args.cards, 2000):
        chunk = []
        for k in range(lo, min(args.cards, lo + 2000)):
            ev = dict(zip(fields, values[k].tolist(), strict=True))
            ev["card"] = k
            ev["ts"] = now - int(rng.integers(60, 7200)) * 1000
            chunk.append(ev)
        ing.ingest(chunk, [e["ts"] for e in chunk])
    load_s = time.perf_counter() - t0
    repo = ModelRepository(work / "models")
    repo.add_onnx("feastpeer", args.model, task="classification",
                  feature_names=[f"fv{v}:fv{v}_f{j}" for v in range(N_VIEWS)
                                 for j in range(N_FEATS)],
                  feature_views=defs.versions(), missing_values="allow")
    config = work / "redline.yaml"
    config.write_text(yaml.safe_dump({
        "repository": str(work / "models"),
        "server": {"watch_repository": False, "grpc_enabled": False},
        "features": {"definitions": str(defs_path), "store": "redis", "redis_url": url},
    }))
    procs.append(subprocess.Popen(
        [*sched_prefix("server"), "taskset", "-c", "0", sys.executable, "-m", "redline.cli",
         "serve", "--config",
         str(config), "--http-port", str(hport), "--no-grpc"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        # One worker process (`serve` defaults to one per core since scaling landed).
        env={**os.environ, **({"PYTHONPATH": str(Path(src).resolve())} if src else {}),
             "REDLINE_SCALING__WORKERS": "1",
             **({"REDLINE_MONITORING__ENABLED": "false"} if args.no_monitoring else {}),
             **(env or {})}))
    http = f"http://127.0.0.1:{hport}"
    wait_http(http, "/v2/health/ready")
    import httpx

    body = orjson.dumps({"entities": {"card": "7"}, "request": {}})
    doc = httpx.post(http + "/v1/models/feastpeer/predict", content=body).json()
    assert doc["path"] == "primary" and not doc["entity_missing"], doc
    return Target(label, http, "feastpeer", body, None, [procs[-1].pid, procs[-2].pid]), {
        "backfill_s": round(load_s, 2), "sample_response": doc}


FLOOR_APP = '''"""The floor: a bare ASGI callable on uvicorn that answers a canned JSON body."""


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})
'''


def start_floor(work: Path, procs: list) -> Target:
    """What any Python HTTP service costs here, under the same noise: no work at all."""
    (work / "floor_app.py").write_text(FLOOR_APP)
    hport = free_port()
    procs.append(subprocess.Popen(
        [*sched_prefix("server"), "taskset", "-c", "0", sys.executable, "-m", "uvicorn",
         "floor_app:app", "--host",
         "127.0.0.1", "--port", str(hport), "--loop", "uvloop", "--http", "httptools",
         "--no-access-log", "--log-level", "warning"],
        cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    http = f"http://127.0.0.1:{hport}"
    deadline = time.monotonic() + 30
    import httpx

    while True:
        try:
            httpx.post(http + "/", content=b"{}", timeout=1)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return Target("floor", http, "-", b"{}", "/", [procs[-1].pid])


def start_feast(args: argparse.Namespace, work: Path, procs: list) -> Target:
    """The Feast peer's app on a copy of its prepared store, served by a redis-server of its
    own (loaded from the snapshot, pinned and scheduled like every target's)."""
    from benchmarks.peers.feast.store import runtime_copy

    rport, hport = free_port(), free_port()
    repo = runtime_copy(args.feast_data, work / "feast", rport)
    procs.append(start_redis(rport, work / "feast"))
    import redis

    deadline = time.monotonic() + 120
    while True:  # the snapshot loads before the first answer
        try:
            redis.Redis(port=rport).ping()
            break
        except (redis.ConnectionError, redis.BusyLoadingError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    env = {**os.environ, "FEAST_REPO": str(repo), "MODEL_PATH": str(args.feast_data /
                                                                    "model.onnx"),
           "FEAST_MODE": "async"}
    procs.append(subprocess.Popen(
        [*sched_prefix("server"), "taskset", "-c", "0", str(args.feast_python), "-m", "uvicorn",
         "app:app", "--host",
         "127.0.0.1", "--port", str(hport), "--loop", "uvloop", "--http", "httptools",
         "--workers", "1", "--no-access-log", "--log-level", "warning"],
        cwd=FEAST_APP, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    http = f"http://127.0.0.1:{hport}"
    wait_http(http, "/health")
    return Target("feast", http, "-", orjson.dumps({"card": 7}), "/predict",
                  [procs[-1].pid, procs[-2].pid])


def stop_all(procs: list, work: Path) -> None:
    """Stop the processes a run started (last started first), then whatever still carries the
    run's tag (what they started), and remove its scratch folder."""
    for proc in reversed(procs):
        try:
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process would not act on SIGTERM
        except ProcessLookupError:
            pass
        proc.terminate()
    for proc in procs:
        proc.wait(30)
    from benchmarks.peers import procs as peer_procs

    if peer_procs.TAG_VARIABLE in os.environ:
        peer_procs.stop_tagged(os.environ[peer_procs.TAG_VARIABLE], grace_s=5)
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    import httpx

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--feast-python", type=Path, default=None,
                        help="the Feast peer's interpreter (default: the feast peer of "
                        "benchmarks/peers/, made when missing)")
    parser.add_argument("--feast-data", type=Path, default=None,
                        help="what the Feast peer's prepare step wrote: repo/, model.onnx, "
                        "dump.rdb (default: the feast peer's)")
    parser.add_argument("--duration", type=float, default=12.0,
                        help="seconds measured per side and case (in 4 interleaved slices)")
    parser.add_argument("--skip-feast", action="store_true")
    parser.add_argument("--no-monitoring", action="store_true",
                        help="serve this tree with monitoring off (the request path alone)")
    parser.add_argument("--cases", help="comma-separated subset of c1,c8,open_500,ladder")
    parser.add_argument("--rounds", type=int, default=4,
                        help="interleaved slices per side and case (default 4)")
    parser.add_argument("--wait", choices=("timer", "yield", "hog"), default="timer",
                        help="how the open-loop generator waits for a send time: a timerfd "
                        "(default), spinning and yielding every turn, or spinning without "
                        "yielding")
    parser.add_argument("--sched", choices=("fifo", "nice", "none"), default="fifo",
                        help="fifo (default): every measured server, its redis-server and the "
                        "load generator run SCHED_FIFO, alike for every target; none: the "
                        "default scheduler")
    parser.add_argument("--idle-poll", action=argparse.BooleanOptionalAction, default=True,
                        help="hold /dev/cpu_dma_latency at 0 (idle CPUs poll, no halt) for "
                        "the run (default on)")
    parser.add_argument("--ladder-rounds", type=int, default=2,
                        help="interleaved slices per side and step of the rate ladder")
    parser.add_argument("--before", help="src/ of another redline tree, served as a third "
                        "target (redline_before) interleaved with the others")
    parser.add_argument("--before-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment of redline_before (this tree unless --before), e.g. "
                        "REDLINE_FEATURES__REDIS_LOOP_READS=false")
    parser.add_argument("--off-target", action="store_true",
                        help="also serve this tree with monitoring off (redline_off), "
                        "interleaved with the others: monitoring's own floor in the same run")
    args = parser.parse_args()
    global RT, SCHED
    SCHED = args.sched
    RT = dict(RT_PRIORITIES) if args.sched == "fifo" else None
    from benchmarks.peers import envs
    from benchmarks.peers.feast.store import prepared

    if args.feast_python is None:
        args.feast_python = envs.ensure("feast")
    args.feast_data = args.feast_data or envs.data_dir("feast")
    # redline serves as many cards as the peer was prepared with, from the same model
    args.cards = int(prepared(args.feast_data)["cards"])
    args.model = str(args.feast_data / "model.onnx")
    os.sched_setaffinity(0, {1})  # the load generator shares CPU 1 with the redis-servers
    qos = None
    if args.idle_poll:  # released when the file closes (at exit)
        import struct

        try:
            qos = open("/dev/cpu_dma_latency", "wb", buffering=0)  # noqa: SIM115
            qos.write(struct.pack("i", 0))
        except OSError as exc:
            print(f"--idle-poll: {exc}; measuring without it", file=sys.stderr)
            args.idle_poll = False
    work = Path(tempfile.mkdtemp(prefix="redline-vs-feast-"))
    from benchmarks.peers import procs as peer_procs

    # Every process the run starts inherits the tag: stop_all finds what they started, too.
    os.environ[peer_procs.TAG_VARIABLE] = peer_procs.new_tag()
    procs: list[subprocess.Popen] = []
    try:
        target, info = start_redline(args, work, procs)
        targets = [target]
        if args.before or args.before_env:
            env = dict(kv.split("=", 1) for kv in args.before_env)
            targets.append(start_redline(args, work, procs, "redline_before", args.before,
                                         env)[0])
        if args.off_target:
            targets.append(start_redline(args, work, procs, "redline_off",
                                         env={"REDLINE_MONITORING__ENABLED": "false"})[0])
        if not args.skip_feast:
            targets.append(start_feast(args, work, procs))
        targets.append(start_floor(work, procs))
        cases = set(args.cases.split(",")) if args.cases else None
        out = {"conditions": {"sched": args.sched, "wait": args.wait,
                              "idle_poll": args.idle_poll,
                              "load_before": os.getloadavg()},
               "redline_setup": info, **compare(targets, args.duration, cases, args.rounds,
                                                args.wait, args.ladder_rounds)}
        out["conditions"]["load_after"] = os.getloadavg()
        # Were any answers degraded (Redis timeouts on the shared CPU)? Say so with the numbers.
        out["redline_pipeline_stats"] = httpx.get(target.url + "/v1/pipeline/stats").json()
    finally:
        stop_all(procs, work)
        if qos is not None:
            qos.close()
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
