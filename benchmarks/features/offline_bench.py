"""Offline point-in-time training set: a million events, 100,000 label rows.

    .venv/bin/python -m benchmarks.features.offline_bench [--events 1000000] [--labels 100000]
        [--replay]

Seconds for build_training_set on one view with 6 features (count/sum/mean/stddev over 1 h,
count/max over 5 min), in the same run as:
  floor   — a plain pandas ``merge_asof`` point-in-time join of per-entity cumulative sums at the
            window's two edges (count, sum, mean, stddev of the 1 h window and the 5 min count:
            no arrival condition, no admission, no max — the least work any as-of join does)
  replay  — (``--replay``) the same build event by event through the decoder and a memory store
            (``method="replay"``, the builder before the column path), and how many values differ
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
    ap.add_argument("--replay", action="store_true",
                    help="also run the event-by-event replay (minutes at the default size)")
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
    out: dict[str, object] = {"events": args.events, "labels": args.labels,
                              "entities": args.entities, "features": 6}
    start = time.perf_counter()
    floor = merge_asof_floor(events, labels)
    out["floor_merge_asof_s"] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    table = build_training_set(defs, events, labels, method="columns")
    seconds = time.perf_counter() - start
    out["redline_columns_s"] = round(seconds, 3)
    out["redline_events_per_s"] = round(args.events / seconds)
    out["ratio_vs_floor"] = round(seconds / out["floor_merge_asof_s"], 2)  # type: ignore[operator]
    out["nonzero_count_1h_rows"] = int((table["card:count_1h"] > 0).sum())
    # the floor ignores arrival: only rows whose window holds no event still in flight agree
    same = np.isclose(floor["count_1h"], table["card:count_1h"]).mean()
    out["floor_rows_equal_count_1h"] = round(float(same), 4)
    if args.replay:
        start = time.perf_counter()
        ref = build_training_set(defs, events, labels, method="replay")
        out["redline_replay_s"] = round(time.perf_counter() - start, 3)
        out["speedup_columns_vs_replay"] = round(out["redline_replay_s"] / seconds, 1)  # type: ignore[operator]
        diff = 0
        for col in ref.columns:
            if col.startswith("card:"):
                a, b = table[col].to_numpy(), ref[col].to_numpy()
                ok = np.isclose(a, b, rtol=1e-9, atol=1e-9) | (np.isnan(a) & np.isnan(b))
                diff += int((~ok).sum())
        out["values_differing_from_replay"] = diff
    print(json.dumps(out))


def merge_asof_floor(events: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """Count/sum/mean/stddev over the label's 1 h tile window and the 5 min count by two
    ``merge_asof`` joins of per-entity cumulative sums (event time only)."""
    ev = events.sort_values("ts", kind="stable")
    g = ev.groupby("card_id", sort=False)
    cum = pd.DataFrame({"card_id": ev["card_id"], "ts": ev["ts"],
                        "n": g.cumcount() + 1, "s": g["amount"].cumsum(),
                        "q": (ev["amount"] ** 2).groupby(ev["card_id"]).cumsum()})
    lab = labels.reset_index(drop=True).assign(row=np.arange(len(labels)))
    out = pd.DataFrame(index=lab.index)

    def at(edge: pd.Series) -> pd.DataFrame:
        q = lab.assign(at=edge.astype(np.int64)).sort_values("at", kind="stable")
        m = pd.merge_asof(q, cum.rename(columns={"ts": "at"}), on="at", by="card_id",
                          allow_exact_matches=False)
        return m.set_index("row").sort_index()[["n", "s", "q"]].fillna(0.0)

    for window, tile, name in ((3_600_000, 300_000, "1h"), (300_000, 30_000, "5m")):
        hi = (lab["ts"] // tile + 1) * tile
        end, start = at(hi), at(hi - window)
        n = end["n"] - start["n"]
        out[f"count_{name}"] = n.to_numpy()
        if name == "1h":
            s = end["s"] - start["s"]
            out["sum_1h"] = s.to_numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = s / n
                out["mean_1h"] = mean.to_numpy()
                out["stddev_1h"] = np.sqrt(np.maximum((end["q"] - start["q"]) / n - mean ** 2,
                                                      0)).to_numpy()
    return out


if __name__ == "__main__":
    main()
