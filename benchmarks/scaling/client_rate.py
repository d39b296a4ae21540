"""How fast one ``redline.AsyncClient`` process can send, and what each request costs it.

Two real replicas (``redline serve --workers 1``, REST only), one client process. The client
sends V2 inferences open-loop at a fixed rate (a request starts every 1/rate s whether or not
the earlier ones have answered, as real traffic does), with hedging and failover on, and the run
records what came back (answered, failed, late), the achieved rate and the client process's
CPU seconds, so the cost reads as cores per 1,000 requests/s.

Peers in the same run, in turns with the redline client (same servers, same seconds): a bare
``httpx.AsyncClient`` and a bare ``aiohttp.ClientSession`` posting the same request to one replica
with no policy at all (no budget, no hedging, no failover). Their cost is the floor a Python
HTTP client pays per request; the redline client's ratio to them is what its policy and
transport add or save.

    PYTHONPATH=src:. .venv/bin/python benchmarks/scaling/client_rate.py --rates 200 1000 2000 \\
        --seconds 5 --rounds 2 --json-out benchmarks/scaling/results-client-rate.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

import redline
from redline.models import ModelRepository
from tests.conftest import free_port
from tests.serving.helpers import affine_model

X = {"x": np.array([[1, 2, 3, 4]], np.float32)}
BODY = b'{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'
PATH = "/v2/models/affine/infer"


def start(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = free_port()
    config = root / f"serve-{port}.yaml"
    config.write_text("runtime:\n  warmup_batch_sizes: [1]\nserver:\n  watch_repository: false\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline.cli", "serve", "--config", str(config), "-r",
         str(root / "repo"), "--http-port", str(port), "--no-grpc", "--workers", "1",
         "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError("server did not start")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


TICK = os.sysconf("SC_CLK_TCK")
SERVER_PIDS: list[int] = []


def servers_cpu_s() -> float:
    """CPU seconds of the replicas' processes (each supervisor and its worker) so far."""
    total = 0.0
    pids = list(SERVER_PIDS)
    for pid in SERVER_PIDS:
        with contextlib.suppress(OSError):
            pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


async def open_loop(call: Callable[[], Awaitable[Any]], rate: float, seconds: float
                    ) -> dict[str, Any]:
    """Start a call every 1/rate s for ``seconds``; wait for all; count and time them."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    failures: list[str] = []

    async def one() -> None:
        t0 = loop.time()
        try:
            await call()
        except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
            failures.append(repr(exc)[:200])
            return
        latencies.append((loop.time() - t0) * 1000.0)

    total = int(rate * seconds)
    tasks: set[asyncio.Task[None]] = set()
    cpu0, server0, t0 = cpu_s(), servers_cpu_s(), loop.time()
    behind_ms = 0.0
    for i in range(total):
        due = t0 + i / rate
        now = loop.time()
        if due > now:
            await asyncio.sleep(due - now)
        else:
            behind_ms = max(behind_ms, (now - due) * 1000.0)
        task = loop.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    sent_s = loop.time() - t0
    while tasks:
        await asyncio.gather(*list(tasks))
    wall = loop.time() - t0
    cpu = cpu_s() - cpu0
    server_cpu = servers_cpu_s() - server0
    lat = sorted(latencies)
    return {
        "offered_rate": rate, "requests": total, "answered": len(latencies),
        "failed": len(failures), "failures": failures[:3],
        "achieved_rate": round(len(latencies) / wall, 1),
        "sender_max_behind_ms": round(behind_ms, 2), "send_seconds": round(sent_s, 3),
        "p50_ms": round(lat[len(lat) // 2], 3) if lat else None,
        "p99_ms": round(lat[int(len(lat) * 0.99)], 3) if lat else None,
        "client_cpu_s": round(cpu, 3), "servers_cpu_s": round(server_cpu, 3),
        "cores_per_1000_rps": round(cpu / wall / (len(latencies) / wall / 1000.0), 4)
        if latencies else None,
    }


async def measure(name: str, urls: list[str], rate: float, seconds: float) -> dict[str, Any]:
    """One client's run; ``loop_errors`` counts what asyncio reported unhandled (an attempt
    left to fail unseen would show here as "Task exception was never retrieved")."""
    errors: list[str] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda _, context: errors.append(str(context.get("message"))))
    out = await _measure(name, urls, rate, seconds)
    gc.collect()
    await asyncio.sleep(0)
    out["loop_errors"] = len(errors)
    return out


async def _measure(name: str, urls: list[str], rate: float, seconds: float) -> dict[str, Any]:
    if name == "redline":
        async with redline.AsyncClient(urls, budget_ms=1000) as client:
            assert client.hedge
            for _ in range(200):  # connections open, p95 learnt
                await client.infer("affine", X)
            stats0 = (client.stats.requests, client.stats.attempts, client.stats.hedges)
            out = await open_loop(lambda: client.infer("affine", X), rate, seconds)
            out["hedges"] = client.stats.hedges - stats0[2]
            out["extra_attempts"] = (client.stats.attempts - stats0[1]) - (
                client.stats.requests - stats0[0])
            return out
    if name == "httpx":
        import httpx

        async with httpx.AsyncClient(base_url=urls[0], timeout=5) as hx:
            async def post_httpx() -> None:
                r = await hx.post(PATH, content=BODY,
                                  headers={"content-type": "application/json"})
                r.raise_for_status()
                r.json()

            for _ in range(200):
                await post_httpx()
            return await open_loop(post_httpx, rate, seconds)
    import aiohttp

    async with aiohttp.ClientSession(base_url=urls[0]) as session:
        async def post_aiohttp() -> None:
            async with session.post(PATH, data=BODY,
                                    headers={"content-type": "application/json"}) as r:
                r.raise_for_status()
                await r.json()

        for _ in range(200):
            await post_aiohttp()
        return await open_loop(post_aiohttp, rate, seconds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", type=float, nargs="+", default=[200.0, 1000.0, 2000.0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", nargs="+", default=["redline", "aiohttp"],
                    help="redline, aiohttp, httpx (httpx's pool falls behind at a few hundred/s)")
    ap.add_argument("--uvloop", action="store_true", help="run the client on uvloop")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="redline-client-rate-"))
    ModelRepository(root / "repo").add_onnx("affine", affine_model())
    servers = [start(root), start(root)]
    SERVER_PIDS.extend(proc.pid for proc, _ in servers)
    urls = [url for _, url in servers]
    runner = asyncio.run
    if args.uvloop:
        import uvloop

        runner = uvloop.run
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for _ in range(args.rounds):
            for rate in args.rates:
                for name in args.clients:
                    row = runner(measure(name, urls, rate, args.seconds))
                    rows.setdefault(str(rate), {}).setdefault(name, []).append(row)
                    print(name, json.dumps(row), flush=True)
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(30)
    summary: dict[str, Any] = {"seconds": args.seconds, "rounds": args.rounds,
                               "loop": "uvloop" if args.uvloop else "asyncio", "rates": {}}
    for rate, by_client in rows.items():
        entry: dict[str, Any] = {}
        for name, runs in by_client.items():
            cost = [r["cores_per_1000_rps"] for r in runs if r["cores_per_1000_rps"]]
            entry[name] = {
                "failed": sum(r["failed"] for r in runs),
                "loop_errors": sum(r["loop_errors"] for r in runs),
                "achieved_rate_min": min(r["achieved_rate"] for r in runs),
                "p99_ms_max": max((r["p99_ms"] or 0.0) for r in runs),
                "cores_per_1000_rps_median": statistics.median(cost) if cost else None,
            }
        if "redline" in entry:
            for peer in ("httpx", "aiohttp"):
                if peer in entry and entry[peer]["cores_per_1000_rps_median"]:
                    entry[f"redline_cost_over_{peer}"] = round(
                        entry["redline"]["cores_per_1000_rps_median"]
                        / entry[peer]["cores_per_1000_rps_median"], 3)
        summary["rates"][rate] = entry
    print(json.dumps(summary, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
