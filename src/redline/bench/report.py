"""How a run is shown: a table for people, JSON for machines."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from redline.bench.runner import BenchResult


def table(results: list[BenchResult], title: str = "redline bench") -> Table:
    grid = Table(title=title, title_justify="left")
    for column in ("protocol", "mode", "load", "req/s", "p50 ms", "p90 ms", "p99 ms",
                   "p99.9 ms", "max ms", "ok", "errors"):
        grid.add_column(column, justify="right" if column not in ("protocol", "mode") else "left")
    for r in results:
        d = r.to_dict()
        lat = d["latency_ms"]
        load = f"{d['rate']:g}/s" if d["rate"] else f"c={d['connections']}"
        errors = ", ".join(f"{k}={v}" for k, v in sorted(d["errors"].items())) or "0"
        grid.add_row(d["protocol"], d["mode"], load, f"{d['throughput_rps']:,.0f}",
                     *(_ms(lat[k]) for k in ("p50", "p90", "p99", "p99.9", "max")),
                     f"{d['ok']:,}", errors)
    return grid


def _ms(value: Any) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def print_table(results: list[BenchResult], title: str = "redline bench") -> None:
    console = Console(width=None if Console().is_terminal else 132)
    console.print(table(results, title))
    for r in results:
        for kind, sample in r.error_samples.items():
            console.print(f"[red]{kind}[/red]: {sample}")
