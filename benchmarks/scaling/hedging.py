"""p99.9 with stragglers, with and without hedged requests (``redline.Client``).

Two replicas (``redline serve --workers 1`` each), each behind a proxy in a process of its own
(``benchmarks/scaling/straggler.py``) that holds every answer for a model service time
(``--service-ms``, 5 ms by default: a model that waits on something, as BigTable's reads did in
Dean and Barroso's measurement; 0 gives the bare server, whose median call is well under a
millisecond of client and server overhead). Replica A's proxy holds 1% of its answers for 50x
the median call instead (``--share``, ``--slowdown``); replica B answers at its normal speed.
The client spreads calls over both (the endpoint ranking alternates: ``explore_every = 2``), so
about 0.5% of all calls straggle: enough to own the p99.9. The hedged client sends a second
request to the other replica once a call has taken longer than its observed ``--quantile`` (p95
by default; the cap on hedges is ``--cap``). A third client, the floor, calls the same replicas
with no stragglers and no hedging: what this machine gives at best, so the hedged p99.9 can be
read against it.

Rounds alternate between the two clients (same servers, same seconds), and the p99.9 and
the share of extra requests are taken over all rounds of each.

With the bare server the floor's own p99.9 (scheduler and GC noise) is several times its
median, and that noise, not the stragglers, bounds what any hedging can show; with a service
time of a few ms the median is the service and the straggler is 50x of something real.

    PYTHONPATH=src:. .venv/bin/python benchmarks/scaling/hedging.py --calls 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import redline
from benchmarks.scaling.straggler import ProxyProcess
from redline.models import ModelRepository
from tests.conftest import free_port
from tests.serving.helpers import affine_model

X = {"x": np.array([[1, 2, 3, 4]], np.float32)}


def start(root: Path) -> tuple[subprocess.Popen[bytes], int]:
    import httpx

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline.cli", "serve", "-r", str(root / "repo"),
         "--http-port", str(port), "--no-grpc", "--no-watch", "--workers", "1",
         "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return proc, port
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError("server did not start")


def run(client: redline.Client, calls: int) -> list[float]:
    waited = []
    for _ in range(calls):
        t0 = time.perf_counter()
        client.infer("affine", X)
        waited.append((time.perf_counter() - t0) * 1000)
    return waited


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=4000, help="calls per round per client")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--share", type=float, default=0.01, help="straggling share on replica A")
    ap.add_argument("--slowdown", type=float, default=50.0)
    ap.add_argument("--quantile", type=float, default=0.95)
    ap.add_argument("--cap", type=float, default=0.05)
    ap.add_argument("--service-ms", type=float, default=5.0,
                    help="every answer's service time (0: the bare server)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="redline-hedge-bench-"))
    ModelRepository(root / "repo").add_onnx("affine", affine_model())
    servers = [start(root), start(root)]
    try:
        # The median call through the proxy, measured first, sets the straggler's delay.
        service_s = args.service_ms / 1000
        plain = ProxyProcess(servers[0][1], 0.0, 0.0, service_s=service_s)
        probe = redline.Client(f"127.0.0.1:{plain.port}", hedge=False)
        run(probe, 300)
        p50 = float(np.median(run(probe, 1000)))
        probe.close()
        plain.stop()
        delay_ms = args.slowdown * p50
        slow = ProxyProcess(servers[0][1], args.share, delay_ms / 1000, seed=7,
                            service_s=service_s)
        fast = ProxyProcess(servers[1][1], 0.0, 0.0, service_s=service_s)
        clean = ProxyProcess(servers[0][1], 0.0, 0.0, service_s=service_s)
        endpoints = [f"127.0.0.1:{slow.port}", f"127.0.0.1:{fast.port}"]
        clients = {
            # The floor: the same two replicas and proxies, no stragglers, no hedging.
            "floor": redline.Client([f"127.0.0.1:{clean.port}", f"127.0.0.1:{fast.port}"],
                                    hedge=False),
            "no_hedge": redline.Client(endpoints, hedge=False),
            "hedge": redline.Client(endpoints, hedge=True, hedge_quantile=args.quantile,
                                    hedge_max_share=args.cap, hedge_min_samples=200),
        }
        for c in clients.values():
            c.endpoints.explore_every = 2
            run(c, 300)  # warm connections; the hedged client learns its p95
        waited: dict[str, list[float]] = {k: [] for k in clients}
        before = {k: (c.stats.requests, c.stats.attempts) for k, c in clients.items()}
        for _ in range(args.rounds):
            for name, c in clients.items():
                waited[name] += run(c, args.calls)
        out: dict[str, object] = {"service_ms": args.service_ms, "median_call_ms": p50,
                                  "straggler_delay_ms": delay_ms,
                                  "straggling_share_on_a": args.share, "rounds": args.rounds,
                                  "calls_per_client": args.calls * args.rounds}
        for name, c in clients.items():
            w = np.array(waited[name])
            requests = c.stats.requests - before[name][0]
            attempts = c.stats.attempts - before[name][1]
            out[name] = {"p50_ms": float(np.percentile(w, 50)),
                         "p99_ms": float(np.percentile(w, 99)),
                         "p999_ms": float(np.percentile(w, 99.9)),
                         "max_ms": float(w.max()),
                         "extra_requests_share": (attempts - requests) / requests,
                         "hedges": c.stats.hedges, "hedge_wins": c.stats.hedge_wins}
            c.close()
        no, yes = out["no_hedge"], out["hedge"]
        out["p999_ratio"] = no["p999_ms"] / yes["p999_ms"]  # type: ignore[index]
        time.sleep(0.5)  # the proxy publishes its count every 0.2 s
        out["stragglers_injected"] = slow.delayed
        out["hedge_p999_over_floor"] = yes["p999_ms"] / out["floor"]["p999_ms"]  # type: ignore[index]
        slow.stop()
        fast.stop()
        clean.stop()
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(30)
    print(json.dumps(out, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
