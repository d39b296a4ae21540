"""``make bench``'s ``cascade`` area: ``cascade_compare.py``'s run as docs/performance.md prints
it (the command, the targets, a row per graph and concurrency)."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.bench_page import Target, number, table, targets_table
from benchmarks.models.cascade_compare import level_key

RESULT = "cascade.json"
NAMES = {"cascade": "cascade (logistic, then MLP)", "logistic": "logistic model alone",
         "mlp": "MLP alone"}


def plan(python: str, rounds: int, out: Path) -> list[str]:
    return [python, "benchmarks/models/cascade_compare.py", "--rounds", str(rounds), "--out",
            str(out)]


def _levels(result: dict) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    """Each closed-loop concurrency and open-loop rate: (summary key, how the page says it)."""
    return ([(f"c{c}", f"c={c}") for c in result["concurrency"]]
            + [(f"r{r:g}", f"open loop at {r:g}/s") for r in result.get("rates", [])])


def targets(result: dict) -> list[Target]:  # type: ignore[type-arg]
    """Accuracy within half a point of the MLP's; p50 and p99 under the MLP's at each
    concurrency and open-loop rate (the median of the rounds' ratios, met in how many)."""
    out = []
    for n, (key, label) in enumerate(_levels(result)):
        s = result["summary"][key]
        if not n:
            out.append(Target("cascade accuracy, points below the MLP's", "<=", 0.5,
                              s["accuracy_points_below_mlp"], unit=" pt"))
        for metric in ("p50_ms", "p99_ms"):
            e = s[metric]
            out.append(Target(f"cascade {metric[:3]} over the MLP's, {label}", "<=", 1.0,
                              e["ratio"], spread=f"{number(e['min'])}–{number(e['max'])}, "
                              f"under 1 in {e['rounds_met']}/{e['rounds']} rounds"))
    return out


def render(stamp: str, result: dict) -> tuple[str, list[Target]]:  # type: ignore[type-arg]
    found = targets(result)
    rows = []
    for n, (key, label) in enumerate(_levels(result)):
        for graph, name in NAMES.items():
            if n and graph == "logistic":
                continue  # the cheap model alone: a reference at the first load only
            cells = [x for x in result["cells"] if x["graph"] == graph and level_key(x) == key]
            p50, p99 = [x["p50_ms"] for x in cells], [x["p99_ms"] for x in cells]
            shares = {k: statistics.median(x["answered"].get(k, 0.0) for x in cells)
                      for k in sorted({k for x in cells for k in x["answered"]})}
            rows.append([name, label, f"{statistics.median(x['accuracy'] for x in cells):.4f}",
                         f"{number(statistics.median(p50))} ({number(min(p50))}–"
                         f"{number(max(p50))})",
                         f"{number(statistics.median(p99))} ({number(min(p99))}–"
                         f"{number(max(p99))})",
                         ", ".join(f"{k} {v:.0%}" for k, v in shares.items()) or "—"])
    header = ["graph", "load", "accuracy", "p50 ms (min–max)", "p99 ms (min–max)",
              "answered by"]
    lead = (f"{result['tickets']} held-out tickets a cell, MLP {result['hidden']}x"
            f"{result['hidden']}, cascade threshold {result['threshold']}, "
            f"{result['rounds']} rounds.")
    return "\n".join([stamp, "", lead, "", *targets_table(found), "",
                      *table(header, rows)]), found
