"""redline's recommender graph against the same graph in Ray Serve, in one interleaved run.

Starts a Redis on a free port (both servers keep session state there), loads the sessions, user
and item windows the peer reads, starts the Ray Serve peer from its own environment (made by
``setup_ray_serve.sh`` under the system temporary folder) in each configuration asked for, and
measures every target in alternation: c=1 and c=8 closed loop (throughput, p50, p99), then an
open-loop ladder of rates, keeping the highest rate whose p99 stays at or below ``--p99-ms``.

    python benchmarks/recommend/compare_ray_serve.py --artifacts examples/recommend/artifacts \
        --data examples/recommend/data --peer one:1:8 --peer three:1:8 \
        [--redline-url http://127.0.0.1:8000 --redline-model recommend]

redline is started as a user would start it: ``redline models add`` of the artifacts into a
scratch repository, then ``redline serve`` of the example's ``redline.yaml`` on the same Redis
(``--redis-url``: its default worker count, one process per core). With ``--redline-url`` the
server there is measured instead; it must serve the example's graph on that Redis.

Prints one JSON document (also to ``--json-out``): per target the best of its rounds, and
``summary``: redline's highest rate over the best peer configuration's, and whether its p99 was
lower at every rate the peer sustained.
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


def start_peer(python: str, artifacts: str, redis_url: str, config: str) -> tuple[
        subprocess.Popen, str]:
    layout, replicas, ongoing = config.split(":")
    port = free_port()
    log = open(Path(tempfile.gettempdir()) / f"redline-ray-serve-{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([python, str(HERE / "ray_serve_app.py"), "--artifacts", artifacts,
                             "--redis-url", redis_url, "--port", str(port), "--layout", layout,
                             "--replicas", replicas, "--max-ongoing", ongoing],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/recommend"
    wait_until(proc, "Ray Serve", log.name, 180, lambda: httpx.post(
        url, json={"session_id": "none", "entities": {"user_id": "none"}}, timeout=5))
    return proc, url


def wait_until(proc: subprocess.Popen, name: str, log: str, seconds: float,
               probe: Callable[[], httpx.Response]) -> None:
    """Until ``probe`` answers 200; a process that exits or stays silent names its log."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited; see {log}")
        try:
            if probe().status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name} did not answer in {seconds:.0f} s; see {log}")


def start_redline(artifacts: str, redis_url: str, model: str) -> tuple[
        subprocess.Popen, str, Path]:
    """``redline models add`` into a scratch repository, then ``redline serve`` of the
    example's settings on ``redis_url``; returns the process, its base URL and the folder."""
    folder = Path(tempfile.mkdtemp(prefix="redline-rec-repo-"))
    redline = [sys.executable, "-c", "from redline.cli import main; main()"]
    config = str(ROOT / "examples" / "recommend" / "redline.yaml")
    subprocess.run([*redline, "models", "add", "-m", model, artifacts, "--config", config,
                    "--repository", str(folder / "models")], check=True, capture_output=True)
    port = free_port()
    log = open(folder / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([*redline, "serve", "--config", config, "--repository",
                             str(folder / "models"), "--redis-url", redis_url, "--http-port",
                             str(port), "--grpc-port", "0", "--no-watch", "--log-level",
                             "warning"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_until(proc, "redline serve", log.name, 120,
               lambda: httpx.get(f"{url}/v2/health/ready", timeout=5))
    return proc, url, folder


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
    return {"best_peer": best_config, "peer_max_rate": rate(peer),
            "redline_max_rate": rate(ours),
            "rate_ratio": rate(ours) / rate(peer) if rate(peer) else None,
            "c1_rps_ratio": ours["c1"]["rps"] / peer["c1"]["rps"],
            "c8_rps_ratio": ours["c8"]["rps"] / peer["c8"]["rps"],
            "p99_lower_at_every_sustained_rate": all(
                ours_at.get(r["rate"], float("inf")) < r["p99_ms"] for r in sustained)}


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, 9)


def measure(targets: dict[str, tuple[str, object]], rounds: int, duration: float,
            p99_ms: float) -> dict[str, dict]:
    """Interleaved: each round runs every target at c=1, then c=8; then the open-loop ladder,
    every target at each rate until it misses the p99 bound."""
    best: dict[str, dict] = {name: {} for name in targets}
    for _ in range(rounds):
        for c in (1, 8):
            for name, (url, bodies) in targets.items():
                res = asyncio.run(closed_loop(url, bodies, c, duration)).to_dict()
                prev = best[name].get(f"c{c}")
                if prev is None or res["rps"] > prev["rps"]:
                    best[name][f"c{c}"] = res
    alive = set(targets)
    for rate in RATES:
        for name in list(alive):
            url, bodies = targets[name]
            res = asyncio.run(open_loop(url, bodies, rate, duration)).to_dict()
            best[name].setdefault("ladder", []).append({"rate": rate, **res})
            if res["p99_ms"] <= p99_ms and not res["errors"]:
                best[name]["max_rate_p99_ok"] = rate
            else:
                alive.discard(name)
        if not alive:
            break
    return best


def main() -> None:
    from generate import read

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", required=True, help="what train.py wrote")
    parser.add_argument("--data", required=True, help="what generate.py wrote")
    parser.add_argument("--peer", action="append", default=None,
                        help="layout:replicas:max_ongoing_requests (repeatable)")
    parser.add_argument("--peer-python", default=None,
                        help="the peer venv's python (default: run setup_ray_serve.sh)")
    parser.add_argument("--redis-url", default=None,
                        help="use this Redis (the one redline serves from) instead of a new one")
    parser.add_argument("--redline-url", default=None)
    parser.add_argument("--redline-model", default="recommend")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--p99-ms", type=float, default=20.0)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--json-out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    python = args.peer_python or subprocess.run(
        ["bash", str(HERE / "setup_ray_serve.sh")], check=True, capture_output=True,
        text=True).stdout.strip().splitlines()[-1]
    redis_proc, redis_url, redis_dir = (None, args.redis_url, None) if args.redis_url \
        else start_redis()
    report: dict = {"p99_bound_ms": args.p99_ms, "peers": {}}
    redline_proc, redline_dir = None, None
    try:
        if args.redline_url is None:
            redline_proc, args.redline_url, redline_dir = start_redline(
                str(Path(args.artifacts).resolve()), redis_url, args.redline_model)
        bodies = load_sessions(redis_url, args.redline_url, read(Path(args.data)),
                               args.sessions)
        encoded = [orjson.dumps(b) for b in bodies]

        def body_of(n: int) -> bytes:
            return encoded[n % len(encoded)]

        for config in args.peer or ["three:1:8"]:
            proc, url = start_peer(python, str(Path(args.artifacts).resolve()), redis_url,
                                   config)
            try:
                targets: dict[str, tuple[str, object]] = {
                    f"ray-serve {config}": (url, body_of),
                    "redline": (f"{args.redline_url}/v1/models/{args.redline_model}/predict",
                                body_of)}
                report["peers"][config] = measure(targets, args.rounds, args.duration,
                                                  args.p99_ms)
            finally:
                stop(proc)
        report["summary"] = summarize(report["peers"])
    finally:
        if redline_proc is not None:
            stop(redline_proc)
            shutil.rmtree(redline_dir, ignore_errors=True)
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
