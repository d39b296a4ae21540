"""redline's recommender graph against the same graph in Ray Serve, in one interleaved run.

Starts a Redis on a free port (both servers keep session state there), loads the sessions, user
and item windows the peer reads, starts the Ray Serve peer from its own environment
(``benchmarks/peers/setup.sh ray-serve`` makes it; this script makes it when it is missing) in
each configuration asked for, and measures every target in alternation: c=1 and c=8 closed loop
(throughput, p50, p99), then an open-loop ladder of rates, keeping the highest rate whose p99
stays at or below ``--p99-ms``. During each turn the other server's processes are paused
(SIGSTOP; ``procs.Turns`` says why), unless ``--side-by-side``.

    python benchmarks/recommend/compare_ray_serve.py --artifacts examples/recommend/artifacts \
        --data examples/recommend/data --peer one:proxy --peer one:proxy:8 --peer one:haproxy \
        --peer one:haproxy:8 [--workers 2] [--redline-url http://127.0.0.1:8000]

A peer configuration is ``LAYOUT:INGRESS[:BATCH]``: ``one`` deployment or ``three`` composed
ones; Ray Serve's default Python ``proxy`` or its throughput-optimized mode behind ``haproxy``;
``@serve.batch`` on retrieval and ranking up to BATCH requests (``ray_serve_app.py`` says what
each does). Every configuration runs ``--workers`` replicas per deployment, as many as redline
has worker processes, with ``--max-ongoing`` requests each and its access log off.

redline is started as a user would start it: ``redline models add`` of the artifacts into a
scratch repository, then ``redline serve`` of the example's ``redline.yaml`` on the same Redis
with ``--workers`` worker processes (default: one per core, redline's own default). With
``--redline-url`` the server there is measured instead; it must serve the example's graph on
that Redis.

Every process a server started is stopped when it is done with, found by a tag in its
environment (``benchmarks/peers/procs.py``): Ray's workers and its HAProxy too, which would
otherwise keep their ports.

Prints one JSON document (also to ``--json-out``): per target the best of its rounds, and
``summary``: against the best peer configuration, redline's highest rate, c=1 and c=8
throughput over the peer's, its c=1 p50 over the peer's, and the rates the peer sustained where
redline's p99 was not lower.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "examples" / "recommend"))
sys.path.insert(0, str(ROOT))

from benchmarks.peers import envs, procs  # noqa: E402
from benchmarks.recommend.load import closed_loop, open_loop  # noqa: E402

RATES = [5, 10, 15, 20, 30, 40, 50, 60, 80, 100, 150, 200, 250, 300, 400, 600, 900, 1300,
         1800, 2500]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis() -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="redline-rec-redis-"))
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port),
                             "--save", "", "--appendonly", "no", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url, folder
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def load_sessions(redis_url: str, redline_url: str, data: object,
                  sessions: int) -> list[dict]:
    """The last ``sessions`` sessions of the data into both servers' state (the peer: a Redis
    list per session and a hash of windows per user; redline: ``POST /v1/sessions/{id}/events``
    and the feature events to ``/v1/events``). Returns the request bodies."""
    import redis
    from features import events_of

    items = {it["item_id"]: i for i, it in enumerate(data.items)}  # type: ignore[attr-defined]
    shift = int(time.time() * 1000) - data.end_ms  # type: ignore[attr-defined]
    by_session: dict[str, list[dict]] = {}
    users: dict[str, list[float]] = {}
    for e in data.events:  # type: ignore[attr-defined]
        by_session.setdefault(e["session_id"], []).append({**e, "ts": e["ts"] + shift})
    chosen = list(by_session.items())[-sessions:]
    for _, evs in chosen:
        for e in evs:
            u = users.setdefault(e["user_id"], [0.0, 0.0, 0.0])
            u[0] += 1
            u[1] += 1
            u[2] += e["type"] == "add_to_cart"
    pipe = redis.Redis.from_url(redis_url).pipeline(transaction=False)
    for user, windows in users.items():
        pipe.hset(f"peer:user:{user}", mapping=dict(zip(
            ("count_1d", "count_7d", "cart_sum_7d"), windows, strict=True)))
    bodies = []
    with httpx.Client(base_url=redline_url, timeout=10) as client:
        for sid, evs in chosen:
            pipe.lpush(f"peer:session:{sid}", *(items[e["item_id"]] for e in evs))
            r = client.post(f"/v1/sessions/{sid}/events", json=[
                {"item_id": e["item_id"], "type": e["type"], "ts_ms": e["ts"]} for e in evs])
            r.raise_for_status()
            r = client.post("/v1/events", content=b"\n".join(
                orjson.dumps(f) for e in evs for f in events_of(e)))
            r.raise_for_status()
            bodies.append({"session_id": sid, "entities": {"user_id": evs[0]["user_id"]}})
    pipe.execute()
    return bodies


class Server:
    """A server this run started: its first process, its tag, its scratch folder."""

    def __init__(self, proc: subprocess.Popen, url: str, tag: str, folder: Path) -> None:
        self.proc, self.url, self.tag, self.folder = proc, url, tag, folder

    def stop(self, show_log: bool = False) -> None:
        """SIGTERM the server and wait for it to shut down what it started; then end whatever
        still carries its tag (Ray's workers, HAProxy) and remove its folder (``show_log``:
        print the end of its log first, for a server that did not come up)."""
        for log in self.folder.glob("*.log") if show_log else ():
            sys.stderr.write(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}\n")
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        procs.stop_tagged(self.tag)
        self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def parse_peer(config: str) -> tuple[str, str, int]:
    """``LAYOUT:INGRESS[:BATCH]`` as (layout, ingress, batch)."""
    parts = config.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("one", "three") or parts[1] not in (
            "proxy", "haproxy") or (len(parts) == 3 and not parts[2].isdigit()):
        raise ValueError(f"peer configuration {config!r}: write LAYOUT:INGRESS[:BATCH], LAYOUT "
                         "one or three, INGRESS proxy or haproxy, e.g. three:haproxy:8")
    return parts[0], parts[1], int(parts[2]) if len(parts) == 3 else 0


def start_peer(python: str, artifacts: str, redis_url: str, config: str, replicas: int,
               max_ongoing: int) -> Server:
    layout, ingress, batch = parse_peer(config)
    port, tag = free_port(), procs.new_tag()
    folder = Path(tempfile.mkdtemp(prefix="rl-ray-"))  # short: Ray's socket paths live here
    log = open(folder / "peer.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([python, str(HERE / "ray_serve_app.py"), "--artifacts", artifacts,
                             "--redis-url", redis_url, "--port", str(port), "--layout", layout,
                             "--replicas", str(replicas), "--max-ongoing", str(max_ongoing),
                             "--ingress", ingress, "--batch", str(batch), "--run-dir",
                             str(folder / "run")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=procs.tagged_env(tag))
    server = Server(proc, f"http://127.0.0.1:{port}/recommend", tag, folder)
    try:
        wait_until(proc, "Ray Serve", 240, lambda: httpx.post(
            server.url, json={"session_id": "none", "entities": {"user_id": "none"}},
            timeout=5))
    except BaseException:
        server.stop(show_log=True)
        raise
    return server


def wait_until(proc: subprocess.Popen, name: str, seconds: float,
               probe: Callable[[], httpx.Response]) -> None:
    """Until ``probe`` answers 200, or the process exits, or ``seconds`` pass."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited before it answered (its log is above)")
        try:
            if probe().status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name} did not answer in {seconds:.0f} s (its log is above)")


def start_redline(artifacts: str, redis_url: str, model: str, workers: int,
                  env: dict[str, str] | None = None) -> Server:
    """``redline models add`` into a scratch repository, then ``redline serve`` of the
    example's settings on ``redis_url`` with ``workers`` worker processes (``env``: more
    environment for it, e.g. ``REDLINE_MONITORING__ENABLED``)."""
    folder = Path(tempfile.mkdtemp(prefix="redline-rec-repo-"))
    redline = [sys.executable, "-c", "from redline.cli import main; main()"]
    config = str(ROOT / "examples" / "recommend" / "redline.yaml")
    subprocess.run([*redline, "models", "add", "-m", model, artifacts, "--config", config,
                    "--repository", str(folder / "models")], check=True, capture_output=True)
    port, tag = free_port(), procs.new_tag()
    log = open(folder / "serve.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([*redline, "serve", "--config", config, "--repository",
                             str(folder / "models"), "--redis-url", redis_url, "--http-port",
                             str(port), "--grpc-port", "0", "--no-watch", "--log-level",
                             "warning"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=procs.tagged_env(tag, {
                                **os.environ, **(env or {}),
                                "REDLINE_SCALING__WORKERS": str(workers)}))
    server = Server(proc, f"http://127.0.0.1:{port}", tag, folder)
    try:
        wait_until(proc, "redline serve", 120,
                   lambda: httpx.get(f"{server.url}/v2/health/ready", timeout=5))
    except BaseException:
        server.stop(show_log=True)
        raise
    return server


def summarize(peers: dict[str, dict[str, dict]]) -> dict:
    """redline against the best peer configuration (the highest rate it sustained, then its
    c=1 throughput), each from the same interleaved run."""
    def rate(result: dict) -> int:
        return int(result.get("max_rate_p99_ok") or 0)

    best_config = max(peers, key=lambda c: (rate(peers[c][f"ray-serve {c}"]),
                                            peers[c][f"ray-serve {c}"]["c1"]["rps"]))
    peer, ours = peers[best_config][f"ray-serve {best_config}"], peers[best_config]["redline"]
    ours_at = {r["rate"]: r["p99_ms"] for r in ours.get("ladder", [])}
    sustained = [r for r in peer.get("ladder", []) if r["rate"] <= rate(peer)]
    not_lower = [r["rate"] for r in sustained
                 if not ours_at.get(r["rate"], float("inf")) < r["p99_ms"]]
    return {"best_peer": best_config, "peer_max_rate": rate(peer),
            "redline_max_rate": rate(ours),
            "rate_ratio": rate(ours) / rate(peer) if rate(peer) else None,
            "c1_rps_ratio": ours["c1"]["rps"] / peer["c1"]["rps"],
            "c8_rps_ratio": ours["c8"]["rps"] / peer["c8"]["rps"],
            "c1_p50_ratio": ours["c1"]["p50_ms"] / peer["c1"]["p50_ms"],
            "peer_sustained_rates": len(sustained),
            "p99_not_lower_at_rates": not_lower,
            "p99_lower_at_every_sustained_rate": not not_lower}


Target = tuple[str, object, "str | None"]  # URL, bodies, the tag of the server's processes


def measure(targets: dict[str, Target], rounds: int, duration: float, p99_ms: float,
            pause: bool = True) -> dict[str, dict]:
    """Interleaved: each round runs every target at c=1, then c=8; then the open-loop ladder,
    every target at each rate until it misses the p99 bound; with ``pause``, each target alone
    (``procs.Turns``)."""
    best: dict[str, dict] = {name: {} for name in targets}
    turns = procs.Turns({name: t[2] for name, t in targets.items()}, pause)
    try:
        for _ in range(rounds):
            for c in (1, 8):
                for name, (url, bodies, _) in targets.items():
                    turns.take(name)
                    res = asyncio.run(closed_loop(url, bodies, c, duration)).to_dict()
                    prev = best[name].get(f"c{c}")
                    if prev is None or res["rps"] > prev["rps"]:
                        best[name][f"c{c}"] = res
        alive = set(targets)
        for rate in RATES:
            for name in list(alive):
                url, bodies, _ = targets[name]
                turns.take(name)
                res = asyncio.run(open_loop(url, bodies, rate, duration)).to_dict()
                best[name].setdefault("ladder", []).append({"rate": rate, **res})
                if res["p99_ms"] <= p99_ms and not res["errors"]:
                    best[name]["max_rate_p99_ok"] = rate
                else:
                    alive.discard(name)
            if not alive:
                break
    finally:
        turns.end()
    return best


def main() -> None:
    from generate import read

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", required=True, help="what train.py wrote")
    parser.add_argument("--data", required=True, help="what generate.py wrote")
    parser.add_argument("--peer", action="append", default=None,
                        help="LAYOUT:INGRESS[:BATCH] (repeatable; default: Ray's two modes, "
                        "each with and without batching: one:proxy, one:proxy:8, one:haproxy, "
                        "one:haproxy:8)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="redline's worker processes and the peer's replicas per deployment "
                        "(default: one per core)")
    parser.add_argument("--max-ongoing", type=int, default=8,
                        help="the peer's max_ongoing_requests per replica")
    parser.add_argument("--peer-python", default=None,
                        help="the peer's interpreter (default: benchmarks/peers' ray-serve "
                        "environment, made when missing)")
    parser.add_argument("--redis-url", default=None,
                        help="use this Redis (the one redline serves from) instead of a new one")
    parser.add_argument("--redline-url", default=None)
    parser.add_argument("--redline-model", default="recommend")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--p99-ms", type=float, default=20.0)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--side-by-side", action="store_true",
                        help="leave the server not being measured running during the other's "
                        "turn (default: paused, so each is measured alone; a server given by "
                        "--redline-url is never paused)")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    configs = args.peer or ["one:proxy", "one:proxy:8", "one:haproxy", "one:haproxy:8"]
    for config in configs:
        try:
            parse_peer(config)
        except ValueError as exc:
            parser.error(str(exc))
    python = args.peer_python or str(envs.ensure("ray-serve"))
    redis_proc, redis_url, redis_dir = (None, args.redis_url, None) if args.redis_url \
        else start_redis()
    report: dict = {"p99_bound_ms": args.p99_ms, "workers": args.workers,
                    "max_ongoing": args.max_ongoing, "alone": not args.side_by_side,
                    "peers": {}}
    redline: Server | None = None
    try:
        if args.redline_url is None:
            redline = start_redline(str(Path(args.artifacts).resolve()), redis_url,
                                    args.redline_model, args.workers)
            args.redline_url = redline.url
        bodies = load_sessions(redis_url, args.redline_url, read(Path(args.data)),
                               args.sessions)
        encoded = [orjson.dumps(b) for b in bodies]

        def body_of(n: int) -> bytes:
            return encoded[n % len(encoded)]

        for config in configs:
            peer = start_peer(python, str(Path(args.artifacts).resolve()), redis_url, config,
                              args.workers, args.max_ongoing)
            try:
                targets: dict[str, Target] = {
                    f"ray-serve {config}": (peer.url, body_of, peer.tag),
                    "redline": (f"{args.redline_url}/v1/models/{args.redline_model}/predict",
                                body_of, redline.tag if redline else None)}
                report["peers"][config] = measure(targets, args.rounds, args.duration,
                                                  args.p99_ms, pause=not args.side_by_side)
            finally:
                peer.stop()
        report["summary"] = summarize(report["peers"])
    except BaseException:
        if redline is not None:  # what the server said about it, before its folder goes
            redline.stop(show_log=True)
            redline = None
        raise
    finally:
        if redline is not None:
            redline.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
            shutil.rmtree(redis_dir, ignore_errors=True)
    text = orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
    if args.json_out:
        args.json_out.write_text(text)
    print(text)

if __name__ == "__main__":
    main()
