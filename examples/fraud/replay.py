"""A client that replays transactions against a running server: score each, then send its events.

The order is the payment switch's: ask ``/v1/models/fraud/predict`` for a score (features as of
now, before this transaction), then push the transaction's events to ``/v1/events`` so the next
transaction of the same card sees it. Event times are re-based to the wall clock (the replayed
stretch is compressed ``speedup`` times; ``speedup=1`` replays in real time).

    python replay.py --url http://127.0.0.1:8000 --data data --last 2000

It prints the live ROC AUC of the replayed scores against the truth, and the server-side latency
(``timings_us.total``) and client round-trip percentiles.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from features import events_of, request_of  # noqa: E402


def replay(url: str, transactions: list[dict], *, model: str = "fraud", speedup: float = 0.0,
           progress: Callable[[int], None] | None = None) -> list[dict]:
    """Score then ingest every transaction; returns one record per transaction.

    ``speedup`` 0 sends as fast as the server answers; otherwise the original gaps divided by it.
    """
    out: list[dict] = []
    t0_data = transactions[0]["ts"] if transactions else 0
    t0_wall = time.time()
    with httpx.Client(base_url=url, timeout=10) as client:
        for i, txn in enumerate(transactions):
            if speedup:
                due = t0_wall + (txn["ts"] - t0_data) / 1000.0 / speedup
                pause = due - time.time()
                if pause > 0:
                    time.sleep(pause)
            live = {**txn, "ts": int(time.time() * 1000)}
            sent = time.perf_counter()
            r = client.post(f"/v1/models/{model}/predict", content=orjson.dumps(request_of(live)))
            doc = r.json()
            if r.status_code != 200:
                raise RuntimeError(f"predict failed ({r.status_code}): {doc}")
            ev = b"\n".join(orjson.dumps(e) for e in events_of(live))
            rtt = time.perf_counter() - sent
            ing = post_events(client, ev)
            if ing.status_code != 200 or ing.json()["accepted"] != 2:
                raise RuntimeError(f"ingest failed ({ing.status_code}): {ing.text}")
            out.append({"txn_id": txn["txn_id"], "score": doc["prediction"],
                        "is_fraud": txn.get("is_fraud"), "path": doc["path"],
                        "degraded": doc["degraded"], "total_us": doc["timings_us"]["total"],
                        "rtt_us": int(rtt * 1e6)})
            if progress is not None:
                progress(i + 1)
    return out


def post_events(client: httpx.Client, body: bytes, tries: int = 5) -> httpx.Response:
    """``POST /v1/events``, sent again on a 503: the store did not take the events (a loaded
    Redis past the server's timeout), and the server's contract is that the sender retries."""
    r = client.post("/v1/events", content=body)
    for attempt in range(tries - 1):
        if r.status_code != 503:
            break
        time.sleep(0.05 * 2 ** attempt)
        r = client.post("/v1/events", content=body)
    return r


def main() -> None:
    import numpy as np
    from generate import generate, read

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--data", default=None,
                        help="a folder generate.py wrote (default: generate with --cards/--days)")
    parser.add_argument("--cards", type=int, default=2000)
    parser.add_argument("--days", type=float, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--last", type=int, default=2000, help="replay the last N transactions")
    parser.add_argument("--speedup", type=float, default=0.0)
    args = parser.parse_args()
    data = read(Path(args.data)) if args.data else generate(args.cards, args.days, args.seed)
    records = replay(args.url, data.transactions[-args.last:], speedup=args.speedup)
    truth = [r["is_fraud"] for r in records]
    if 0 < sum(truth) < len(truth):
        from sklearn.metrics import roc_auc_score

        auc = roc_auc_score(truth, [r["score"] for r in records])
        print(f"live ROC AUC {auc:.3f} over {len(records)} transactions ({sum(truth)} fraud)")
    server = np.array([r["total_us"] for r in records]) / 1000
    rtt = np.array([r["rtt_us"] for r in records]) / 1000
    print(f"server time p50 {np.percentile(server, 50):.2f} ms, p99 "
          f"{np.percentile(server, 99):.2f} ms; round trip p50 {np.percentile(rtt, 50):.2f} ms, "
          f"p99 {np.percentile(rtt, 99):.2f} ms; "
          f"{sum(r['degraded'] for r in records)} degraded")
    flagged = sorted(records, key=lambda r: -r["score"])[:10]
    print(f"scored {len(records)} transactions; highest scores:")
    for r in flagged:
        print(f"  {r['txn_id']:>8}  score {r['score']:.3f}  fraud={r['is_fraud']}")


if __name__ == "__main__":
    main()
