"""redline's drift verdicts beside Evidently's default data-drift preset, on the same data.

Known data, known truth: a reference sample from fixed distributions (6 numeric features, 3
categorical), then live windows that are either fresh draws from the same distributions (every
alarm is a false alarm) or the same with one known shift of growing size (a missed shift is a
miss). Each configuration is run with a small reference (1,000 rows: Evidently's defaults pick
p-value tests, KS and chi-square) and a large one (20,000 rows: its defaults pick Wasserstein and
Jensen-Shannon distances at 0.1), and live windows of 500 and 5,000 rows. Also the cost of one
verdict per 10,000 live rows.

Evidently is not a redline dependency. Its 0.7 release needs pandas < 3, so run this in its own
virtual environment with redline's sources on the path:

    python -m venv .venv-evidently && .venv-evidently/bin/pip install evidently 'pandas<3'
    PYTHONPATH=src .venv-evidently/bin/python benchmarks/observability/drift_vs_evidently.py

(``--trials`` sets the windows per cell; ``--json-out`` keeps the numbers.)
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from typing import Any

import numpy as np
import pandas as pd

from redline.models.metadata import profile_inputs
from redline.monitoring.drift import DriftMonitor

NUMERIC = ["normal", "lognormal", "exponential", "uniform", "bimodal", "count"]
CATEGORICAL = ["channel", "country", "device"]
NAMES = NUMERIC + CATEGORICAL
CHANNEL_P = np.array([0.55, 0.25, 0.12, 0.05, 0.03])
NUMERIC_SHIFTS = [0.05, 0.1, 0.2, 0.3, 0.5]  # mean of "normal" moved by this many std
CATEGORICAL_SHIFTS = [0.02, 0.05, 0.1, 0.2]  # share moved from channel 0 to channel 4


def draw(rng: np.random.Generator, n: int, mean_shift: float = 0.0,
         moved_share: float = 0.0) -> np.ndarray:
    channel_p = CHANNEL_P.copy()
    channel_p[0] -= moved_share
    channel_p[4] += moved_share
    bimodal = np.where(rng.random(n) < 0.3, rng.normal(-2, 0.5, n), rng.normal(2, 1, n))
    return np.column_stack([
        rng.normal(50 + 10 * mean_shift, 10, n), rng.lognormal(3, 0.8, n),
        rng.exponential(5, n), rng.uniform(0, 100, n), bimodal, rng.poisson(30, n),
        rng.choice(5, n, p=channel_p), rng.choice(12, n, p=np.ones(12) / 12),
        rng.choice(3, n, p=[0.7, 0.2, 0.1]),
    ]).astype(np.float64)


# ---------------------------------------------------------------------- the two judges
class Redline:
    def __init__(self, reference: np.ndarray) -> None:
        self.profile = profile_inputs(reference, NAMES)

    def drifted(self, live: np.ndarray) -> set[str]:
        monitor = self._monitor(live.shape[0])
        monitor.add(live, None)
        return set(monitor.report()["drifted"])

    _cache: dict[int, DriftMonitor] = {}

    def _monitor(self, n: int) -> DriftMonitor:
        # One monitor per window size, emptied per verdict: its calibrated thresholds are kept,
        # as in a server where they are computed once per version and window size.
        monitor = self._cache.get(n)
        if monitor is None or monitor.profile_id != id(self.profile):  # type: ignore[attr-defined]
            monitor = DriftMonitor("bench", "1", self.profile, NAMES, window_rows=n, min_rows=100)
            monitor.profile_id = id(self.profile)  # type: ignore[attr-defined]
            self._cache[n] = monitor
        monitor.window.size = monitor.window.pos = 0
        return monitor


class Evidently:
    def __init__(self, reference: np.ndarray) -> None:
        from evidently import DataDefinition, Dataset

        self.definition = DataDefinition(numerical_columns=NUMERIC,
                                         categorical_columns=CATEGORICAL)
        self.reference = Dataset.from_pandas(frame(reference), data_definition=self.definition)

    def drifted(self, live: np.ndarray) -> set[str]:
        from evidently import Dataset, Report
        from evidently.presets import DataDriftPreset

        current = Dataset.from_pandas(frame(live), data_definition=self.definition)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            snapshot = Report([DataDriftPreset()]).run(current, self.reference)
        out = set()
        for metric in snapshot.dict()["metrics"]:
            cfg = metric["config"]
            if cfg.get("type") != "evidently:metric_v2:ValueDrift":
                continue
            value, threshold = float(metric["value"]), float(cfg["threshold"])
            p_value = "p_value" in cfg["method"]
            if (value < threshold) if p_value else (value >= threshold):
                out.add(cfg["column"])
        self.last_methods = {m["config"]["column"]: m["config"]["method"]
                             for m in snapshot.dict()["metrics"]
                             if m["config"].get("type") == "evidently:metric_v2:ValueDrift"}
        return out


def frame(x: np.ndarray) -> pd.DataFrame:
    df = pd.DataFrame(x[:, : len(NUMERIC)], columns=NUMERIC)
    for j, name in enumerate(CATEGORICAL):
        df[name] = [f"c{int(v)}" for v in x[:, len(NUMERIC) + j]]
    return df


# ---------------------------------------------------------------------- the runs
def run(trials: int, seed: int, references: list[int]) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    results: dict[str, Any] = {"trials": trials, "cells": []}
    for ref_rows in references:
        reference = draw(rng, ref_rows)
        judges = {"redline": Redline(reference), "evidently": Evidently(reference)}
        for window in (500, 5000):
            cell: dict[str, Any] = {"reference_rows": ref_rows, "window_rows": window}
            # false alarms: unchanged data
            fa = {k: {"feature_alarms": 0, "windows_with_alarm": 0} for k in judges}
            for _ in range(trials):
                live = draw(rng, window)
                for name, judge in judges.items():
                    got = judge.drifted(live)
                    fa[name]["feature_alarms"] += len(got)
                    fa[name]["windows_with_alarm"] += bool(got)
            for name in judges:
                fa[name]["feature_alarm_rate"] = round(
                    fa[name]["feature_alarms"] / (trials * len(NAMES)), 4)
                fa[name]["window_alarm_rate"] = round(fa[name]["windows_with_alarm"] / trials, 4)
            cell["false_alarms"] = fa
            cell["evidently_methods"] = sorted(set(judges["evidently"].last_methods.values()))
            # detection: one known shift at a time
            det: dict[str, dict[str, float]] = {k: {} for k in judges}
            shifts = [("normal", f"mean +{s} std", {"mean_shift": s}) for s in NUMERIC_SHIFTS]
            shifts += [("channel", f"{s:.0%} of mass moved", {"moved_share": s})
                       for s in CATEGORICAL_SHIFTS]
            for feature, label, kw in shifts:
                hits = dict.fromkeys(judges, 0)
                for _ in range(max(5, trials // 2)):
                    live = draw(rng, window, **kw)
                    for name, judge in judges.items():
                        hits[name] += feature in judge.drifted(live)
                for name in judges:
                    det[name][f"{feature}: {label}"] = round(hits[name] / max(5, trials // 2), 3)
            cell["detection"] = det
            results["cells"].append(cell)
            print(json.dumps(cell))
    # cost per 10k live rows (reference 20k), best of 3 after one warm-up
    reference = draw(rng, 20000)
    live = draw(rng, 10000)
    cost = {}
    for name, judge in (("redline", Redline(reference)), ("evidently", Evidently(reference))):
        t0 = time.perf_counter()
        judge.drifted(live)
        first = time.perf_counter() - t0
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            judge.drifted(live)
            times.append(time.perf_counter() - t0)
        cost[name] = {"first_ms": round(first * 1e3, 1),
                      "per_10k_rows_ms": round(min(times) * 1e3, 1)}
    results["cost"] = cost
    return results


def table(results: dict[str, Any]) -> str:
    lines = ["| reference rows | window rows | false alarms per feature (redline / Evidently) | "
             "windows with any false alarm (redline / Evidently) |", "|---|---|---|---|"]
    for c in results["cells"]:
        r, e = c["false_alarms"]["redline"], c["false_alarms"]["evidently"]
        lines.append(f"| {c['reference_rows']:,} | {c['window_rows']:,} | "
                     f"{r['feature_alarm_rate']:.1%} / {e['feature_alarm_rate']:.1%} | "
                     f"{r['window_alarm_rate']:.0%} / {e['window_alarm_rate']:.0%} |")
    lines += ["", "| shift | " + " | ".join(f"ref {c['reference_rows']:,}, window "
                                            f"{c['window_rows']:,}" for c in results["cells"])
              + " |", "|---|" + "---|" * len(results["cells"])]
    for shift in results["cells"][0]["detection"]["redline"]:
        row = [f"{c['detection']['redline'][shift]:.0%} / {c['detection']['evidently'][shift]:.0%}"
               for c in results["cells"]]
        lines.append(f"| {shift} | " + " | ".join(row) + " |")
    cost = results["cost"]
    lines += ["", f"cost per 10,000 live rows (9 features, reference 20,000): redline "
              f"{cost['redline']['per_10k_rows_ms']} ms (first, with calibration: "
              f"{cost['redline']['first_ms']} ms), Evidently "
              f"{cost['evidently']['per_10k_rows_ms']} ms "
              f"(first {cost['evidently']['first_ms']} ms)"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="live windows per cell")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--json-out", default=None, help="write the numbers here")
    parser.add_argument("--reference-rows", type=int, nargs="+", default=[1000, 20000],
                        help="reference sizes to run (Evidently is slow on large ones)")
    args = parser.parse_args()
    results = run(args.trials, args.seed, args.reference_rows)
    print(table(results))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
