"""Replay held-out sessions through a running server: recommend, then post the event.

For every event of the replayed sessions, in time order: when it is a click after the session's
first event, ask ``/v1/models/recommend/predict`` for the top 10 with the session id and the
user's windows as request fields (as of that moment), and score the answer against the item
actually clicked; then post the event to ``/v1/sessions/{id}/events``, so the next request of
the session, on any replica, sees it.

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

from ranking import USER_FIELDS  # noqa: E402


def user_windows(data: object, requests: list[dict]) -> list[dict]:
    """The user's windows as request fields, point-in-time for each request."""
    import pandas as pd
    from features import events_of
    from train import windows

    from redline.features import load_definitions

    defs = load_definitions(HERE / "features.py")
    feats = pd.DataFrame([f for e in data.events for f in events_of(e)])  # type: ignore
    users = feats[feats["source"] == "user_events"].dropna(axis=1)
    values = windows(defs, users, "user_id", [r["user_id"] for r in requests],
                     np.array([r["ts"] for r in requests]), list(USER_FIELDS.values()))
    return [dict(zip(USER_FIELDS, map(float, row), strict=True)) for row in values]


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
    fields = iter(user_windows(data, asks))
    asked = {id(e) for e in asks}
    out: list[dict] = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for e in events:
            if id(e) in asked:
                body = {"session_id": e["session_id"], "request": next(fields)}
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


def main() -> None:
    from generate import read

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--data", default="data")
    parser.add_argument("--model", default="recommend")
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--holdout-days", type=float, default=1.0)
    args = parser.parse_args()
    data = read(Path(args.data))
    records = replay(args.url, data, held_out_sessions(data, args.holdout_days, args.sessions),
                     model=args.model)
    print(summary(records))


if __name__ == "__main__":
    main()
