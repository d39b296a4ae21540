"""Latency and throughput of ``/v1/models/fraud/predict`` with redline's load generator.

Runs in its own process so the load generator never shares an interpreter with the server.

    python bench.py --url http://127.0.0.1:8000 --body '{"entities": ..., "request": ...}'
"""

from __future__ import annotations

import argparse

import orjson


def main() -> None:
    from redline.bench.runner import LoadSpec, run_load

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="fraud")
    parser.add_argument("--body", required=True, help="the /v1 predict JSON body to send")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rate", type=float, default=None, help="open loop at this rate")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args()
    spec = LoadSpec(url=args.url, model=args.model, rate=args.rate,
                    connections=args.concurrency if args.rate is None else 64,
                    duration_s=args.duration, warmup_s=args.warmup,
                    v1_body=args.body.encode())
    print(orjson.dumps(run_load(spec).to_dict()).decode())


if __name__ == "__main__":
    main()
