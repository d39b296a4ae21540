"""Replay the held-out tickets through the served graphs: accuracy and latency of each.

Each ticket is sent, one request per ticket, to the cascade (``textclf``) and to each model
alone (``textclf_logistic``, ``textclf_mlp``), the three requests interleaved so that the three
graphs meet the same conditions; the client measures each request's round trip over a kept-alive
connection (V2 REST, JSON). Prints accuracy, p50 and p99 per graph, and the share of tickets
each step of the cascade answered (its ``answered_by`` output). A request the server does not
answer 200 (a 504 past the budget of 1 s) counts as an error and a wrong answer.

    python replay.py --url http://127.0.0.1:8000 --data data --tickets 600
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

GRAPHS = ("textclf", "textclf_logistic", "textclf_mlp")
CLASSES = ["billing", "shipping", "account", "technical"]
BUDGET = {"x-redline-budget-ms": "1000"}  # the latency is measured, not cut at the default SLO


def ask(client: httpx.Client, model: str, text: str) -> tuple[float, dict[str, list] | None]:
    """The round trip and the outputs (None: the server refused or gave up, e.g. a 504)."""
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}
    t0 = time.perf_counter()
    resp = client.post(f"/v2/models/{model}/infer", json=body, headers=BUDGET)
    took = time.perf_counter() - t0
    if resp.status_code != 200:
        return took, None
    return took, {o["name"]: o["data"] for o in resp.json()["outputs"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--data", default="data")
    parser.add_argument("--tickets", type=int, default=600, help="held-out tickets to send")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="clients sending at once (each waits for its answer)")
    args = parser.parse_args()
    rows = [json.loads(line) for line in (Path(args.data) / "test.jsonl").read_text()
            .splitlines()][: args.tickets]
    times: dict[str, list[float]] = {g: [] for g in GRAPHS}
    right: Counter[str] = Counter()
    answered: Counter[str] = Counter()
    failed: Counter[str] = Counter()

    def one(row: dict, client: httpx.Client) -> None:
        for model in GRAPHS:
            took, out = ask(client, model, row["text"])
            times[model].append(took)
            if out is None:
                failed[model] += 1
                continue
            right[model] += out["label"][0] == CLASSES[row["label"]]
            if "answered_by" in out:
                answered[out["answered_by"][0]] += 1

    with httpx.Client(base_url=args.url, timeout=10) as warm:
        for row in rows[:20]:  # first requests: connections and code paths warm
            for model in GRAPHS:
                ask(warm, model, row["text"])
    clients = [httpx.Client(base_url=args.url, timeout=10) for _ in range(args.concurrency)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(lambda i: one(rows[i], clients[i % args.concurrency]), range(len(rows))))
    for client in clients:
        client.close()
    print(f"{len(rows)} held-out tickets, concurrency {args.concurrency}, round trip (ms):")
    print(f"{'graph':18s} {'accuracy':>9s} {'p50':>7s} {'p99':>7s} {'errors':>7s}")
    for model in GRAPHS:
        t = np.array(times[model]) * 1e3
        print(f"{model:18s} {right[model] / len(rows):9.4f} {np.percentile(t, 50):7.2f} "
              f"{np.percentile(t, 99):7.2f} {failed[model]:7d}")
    shares = ", ".join(f"{step} {n / len(rows):.1%}" for step, n in answered.most_common())
    print(f"the cascade's answers: {shares}")


if __name__ == "__main__":
    main()
