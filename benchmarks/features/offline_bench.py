"""Offline point-in-time training set: a million events, 100,000 label rows.

    .venv/bin/python -m benchmarks.features.offline_bench [--events 1000000] [--labels 100000]

Reports seconds for build_training_set (DuckDB range joins) on one view with 6 features
(count/sum/mean/stddev over 1 h, count/max over 5 min).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

from redline.features import (
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    agg_max,
    agg_sum,
    count,
    mean,
    stddev,
)
from redline.features.offline import build_training_set


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--labels", type=int, default=100_000)
    ap.add_argument("--entities", type=int, default=10_000)
    args = ap.parse_args()
    card = Entity("card", "card_id")
    src = EventSource("tx", card, {"card_id": str, "amount": float}, allowed_lateness="5m")
    defs = FeatureDefinitions.of([FeatureView("card", src, [
        count("1h"), agg_sum("amount", "1h"), mean("amount", "1h"), stddev("amount", "1h"),
        count("5m"), agg_max("amount", "5m")])])
    rng = np.random.default_rng(0)
    t0 = 1_767_225_600_000
    span = 7 * 86_400_000
    ts = np.sort(rng.integers(t0, t0 + span, args.events))
    events = pd.DataFrame({
        "card_id": [f"c{i}" for i in rng.integers(0, args.entities, args.events)],
        "amount": rng.gamma(2.0, 30.0, args.events), "ts": ts,
        "_arrival_ms": ts + rng.integers(0, 2_000, args.events)})
    labels = pd.DataFrame({
        "card_id": [f"c{i}" for i in rng.integers(0, args.entities, args.labels)],
        "ts": rng.integers(t0, t0 + span, args.labels), "label": rng.integers(0, 2, args.labels)})
    start = time.perf_counter()
    table = build_training_set(defs, events, labels)
    seconds = time.perf_counter() - start
    print(json.dumps({"events": args.events, "labels": args.labels, "entities": args.entities,
                      "features": 6, "seconds": round(seconds, 2),
                      "events_per_s": round(args.events / seconds),
                      "nonzero_count_1h_rows": int((table["card:count_1h"] > 0).sum())}))


if __name__ == "__main__":
    main()
