"""End-to-end ``/v1`` predictions with features from Redis, over REST and gRPC.

The fraud example's model and features (``examples/fraud``): a redis-server on a free port is
backfilled with a week of transactions, ``redline serve`` (one process) reads features from it,
and redline's open-loop load generator (``redline.bench``, in this process) measures:

* closed loop, one client: p50/p99 and throughput;
* open loop at 500 req/s (the rate the Feast comparison uses);
* the highest open-loop rate with p99 <= 5 ms (rate search).

    .venv/bin/python benchmarks/pipeline/bench_v1.py [--cards 2000] [--duration 5]

Prints one JSON document. The FastAPI + Feast + ONNX Runtime peer (``benchmarks/peers/feast/``)
is not started by this script; ``feast_compare.py`` runs that comparison.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fraud"
sys.path.insert(0, str(EXAMPLE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server not ready")


def main() -> None:
    import features as fx
    import generate
    import train

    from redline.bench.runner import LoadSpec, find_max, run_load
    from redline.features import load_definitions
    from redline.features.ingest import Ingestor
    from redline.features.online.redis import RedisStore
    from redline.proto import redline_v1_pb2 as v1

    parser = argparse.ArgumentParser()
    parser.add_argument("--cards", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="redline-bench-v1-"))
    rport, hport, gport = free_port(), free_port(), free_port()
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(rport),
                              "--save", "", "--appendonly", "no", "--dir", str(work)],
                             stdout=subprocess.DEVNULL)
    server = None
    try:
        data = generate.generate(args.cards, 8, seed=7)
        result = train.train(data, work / "models")
        defs = load_definitions(EXAMPLE / "features.py")
        url = f"redis://127.0.0.1:{rport}/0"
        time.sleep(0.3)
        events = [e for t in data.transactions for e in fx.events_of(t)]
        events += [fx.label_event(r) for r in data.labels]
        events.sort(key=lambda e: e["ts"])
        ing = Ingestor(defs, RedisStore(url, timeout_ms=10_000))  # bulk backfill
        for i in range(0, len(events), 5000):
            chunk = events[i:i + 5000]
            ing.ingest(chunk, [e["ts"] for e in chunk])
        config = work / "redline.yaml"
        config.write_text(yaml.safe_dump({
            "repository": str(work / "models"),
            "server": {"watch_repository": False},
            "features": {"definitions": str(EXAMPLE / "features.py"), "store": "redis",
                         "redis_url": url},
        }))
        server = subprocess.Popen(
            [sys.executable, "-m", "redline.cli", "serve", "--config", str(config),
             "--http-port", str(hport), "--grpc-port", str(gport)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
        http = f"http://127.0.0.1:{hport}"
        wait_http(http)
        txn = data.transactions[-1]
        body = fx.request_of(txn)
        body.pop("request_id")
        rest_body = orjson.dumps(body)
        grpc_body = v1.PredictRequest(model_name="fraud", instances=[v1.Instance(
            entities=body["entities"], request=body["request"])]).SerializeToString()
        out: dict = {"cards": args.cards, "transactions": len(data.transactions),
                     "roc_auc_holdout": result["roc_auc"], "cpus": os.cpu_count()}
        for proto, target, payload in (("json", http, rest_body),
                                       ("grpc", f"127.0.0.1:{gport}", grpc_body)):
            base = dict(url=target, model="fraud", protocol=proto, duration_s=args.duration,
                        warmup_s=1.0, v1_body=payload)
            closed = run_load(LoadSpec(**base, connections=1))
            at500 = run_load(LoadSpec(**base, rate=500.0, connections=64))
            best, _ = find_max(LoadSpec(**{**base, "duration_s": min(args.duration, 4.0)},
                                        connections=64), 5.0, start_rate=500.0, steps=3)
            out["rest" if proto == "json" else "grpc"] = {
                "closed_c1": closed.to_dict(), "open_500": at500.to_dict(),
                "max_rate_p99_le_5ms": best.spec.rate if best else None,
                "max_rate_run": best.to_dict() if best else None,
            }
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        redis.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
