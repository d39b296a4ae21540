"""Replay held-out sessions through a running server: recommend, then post the event.

For every event of the replayed sessions, in time order: when it is a click after the session's
first event, ask ``/v1/models/recommend/predict`` for the top 10 with the session id and the
user (the graph reads the user's windows from the online store), and score the answer against
the item actually clicked; then post the event to ``/v1/sessions/{id}/events`` and its feature
events to ``/v1/events``, so the next request, on any replica, sees both. Times are moved so
the data ends now.

    python replay.py --data data --sessions 300 --write-history history.jsonl   # for --preload
    python replay.py --url http://127.0.0.1:8000 --data data --sessions 300

It prints the online recall@10 and NDCG@10, the server time (``timings_us.total``) and the
round-trip percentiles.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from features import events_of  # noqa: E402


def write_history(data: object, sessions: list[str], out: Path) -> int:
    """The feature events of every session not replayed, moved so the data ends now, for
    ``redline serve --preload``; returns how many."""
    from features import events_of

    shift = int(time.time() * 1000) - data.end_ms  # type: ignore[attr-defined]
    skip = set(sessions)
    rows = [{**f, "ts": f["ts"] + shift} for e in data.events  # type: ignore[attr-defined]
            if e["session_id"] not in skip for f in events_of(e)]
    out.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    return len(rows)


def replay(url: str, data: object, sessions: list[str], *,
           model: str = "recommend") -> list[dict]:
    """Recommend-then-post over the events of ``sessions``; one record per recommendation."""
    wanted = set(sessions)
    events = [e for e in data.events if e["session_id"] in wanted]  # type: ignore[attr-defined]
    seen: dict[str, set[str]] = {}
    asks = []
    for e in events:
        items = seen.setdefault(e["session_id"], set())
        if e["type"] == "click" and items and e["item_id"] not in items:
            asks.append(e)
        items.add(e["item_id"])
    asked = {id(e) for e in asks}
    shift = int(time.time() * 1000) - data.end_ms  # type: ignore[attr-defined]
    out: list[dict] = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for original in events:
            e = {**original, "ts": original["ts"] + shift}
            if id(original) in asked:
                body = {"session_id": e["session_id"], "entities": {"user_id": e["user_id"]}}
                sent = time.perf_counter()
                r = client.post(f"/v1/models/{model}/predict", content=orjson.dumps(body))
                rtt = time.perf_counter() - sent
                doc = r.json()
                if r.status_code != 200:
                    raise RuntimeError(f"predict failed ({r.status_code}): {doc}")
                ids = [it["item_id"] for it in doc["items"]]
                rank = ids.index(e["item_id"]) if e["item_id"] in ids else None
                out.append({"hit": rank is not None,
                            "ndcg": 0.0 if rank is None else 1.0 / np.log2(rank + 2.0),
                            "degraded": doc["degraded"], "path": doc["path"],
                            "total_us": doc["timings_us"]["total"], "rtt_us": int(rtt * 1e6)})
            posted = client.post(f"/v1/sessions/{e['session_id']}/events", json={
                "item_id": e["item_id"], "type": e["type"], "ts_ms": e["ts"]})
            if posted.status_code != 200:
                raise RuntimeError(f"session post failed ({posted.status_code}): {posted.text}")
            ingest = post_events(client, b"\n".join(orjson.dumps(f) for f in events_of(e)))
            if ingest.status_code != 200:
                raise RuntimeError(f"ingest failed ({ingest.status_code}): {ingest.text}")
    return out


def summary(records: list[dict]) -> str:
    server = np.array([r["total_us"] for r in records]) / 1000
    rtt = np.array([r["rtt_us"] for r in records]) / 1000
    return (f"online recall@10 {np.mean([r['hit'] for r in records]):.3f}, NDCG@10 "
            f"{np.mean([r['ndcg'] for r in records]):.3f} over {len(records)} requests; "
            f"server time p50 {np.percentile(server, 50):.2f} ms, p99 "
            f"{np.percentile(server, 99):.2f} ms; round trip p50 {np.percentile(rtt, 50):.2f} "
            f"ms, p99 {np.percentile(rtt, 99):.2f} ms; "
            f"{sum(r['degraded'] for r in records)} degraded")


def held_out_sessions(data: object, holdout_days: float, count: int) -> list[str]:
    """The first ``count`` sessions that start in the held-out last days (train.py's split)."""
    split = data.end_ms - int(holdout_days * 24 * 3_600_000)  # type: ignore[attr-defined]
    start: dict[str, int] = {}
    for e in data.events:  # type: ignore[attr-defined]
        start.setdefault(e["session_id"], e["ts"])
    return [s for s, t in start.items() if t >= split][:count]


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
    from generate import read

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--data", default="data")
    parser.add_argument("--model", default="recommend")
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--holdout-days", type=float, default=1.0)
    parser.add_argument("--write-history", default=None,
                        help="write the other sessions' feature events here and stop")
    args = parser.parse_args()
    data = read(Path(args.data))
    sessions = held_out_sessions(data, args.holdout_days, args.sessions)
    if args.write_history:
        n = write_history(data, sessions, Path(args.write_history))
        print(f"{n} feature events -> {args.write_history}")
        return
    print(summary(replay(args.url, data, sessions, model=args.model)))


if __name__ == "__main__":
    main()
