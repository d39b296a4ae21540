"""Show an optimize run: a progress bar while it works, a table on screen, JSON and Markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from redline.optimize.optimizer import CandidateResult, OptimizeReport


class RichProgress:
    """The ``Progress`` protocol of the optimizer, drawn with rich on stderr."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), console=console or Console(stderr=True), transient=True,
        )
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def stage(self, label: str, total: int | None = None) -> None:
        if total is None and self._task is not None:
            self._progress.update(self._task, description=label)
            return
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(label, total=total)

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)


def _row(report: OptimizeReport, r: CandidateResult) -> list[str]:
    small, big = min(report.batch_sizes), max(report.batch_sizes)
    status = "chosen" if r.name == report.chosen else ("ok" if r.within_tolerance else "too lossy")
    if r.name == "original":
        status = "baseline"
    metric = r.metrics.get(report.metric)
    return [
        r.name,
        f"{r.latency[small].p50_us:.1f}", f"{r.latency[small].p99_us:.1f}",
        f"{r.latency[big].p50_us:.1f}", f"{r.latency[big].p99_us:.1f}",
        f"{r.latency[big].per_row_us:.2f}",
        f"{r.speedup[small]:.2f}x", f"{r.speedup[big]:.2f}x",
        f"{r.size_bytes / 1024:.1f}",
        f"{metric:.4f}" if metric is not None else "-",
        f"{-r.metric_loss:+.2%}",
        f"{r.max_abs_diff:.2g}",
        f"{r.disagreement:.2%}",
        status,
    ]


def _headers(report: OptimizeReport) -> list[str]:
    small, big = min(report.batch_sizes), max(report.batch_sizes)
    return ["candidate", f"p50@{small} µs", f"p99@{small} µs", f"p50@{big} µs", f"p99@{big} µs",
            f"µs/row@{big}", f"speed-up@{small}", f"speed-up@{big}", "size KiB", report.metric,
            f"Δ{report.metric}", "max |Δout|", "changed rows", "status"]


def wide_console() -> Console:
    """A console wide enough for the table even when output is piped (CI logs)."""
    console = Console()
    return console if console.is_terminal and console.width >= 150 else Console(width=170)


def print_report(report: OptimizeReport, console: Console | None = None) -> None:
    console = console or wide_console()
    table = Table(title=f"redline optimize: {report.model}"
                  + (f" v{report.version}" if report.version else "")
                  + f" — {report.eval_rows} evaluation rows, tolerance {report.tolerance:.2%} "
                  f"relative {report.metric}")
    for i, header in enumerate(_headers(report)):
        table.add_column(header, justify="left" if i == 0 or header == "status" else "right")
    for r in report.results:
        style = "bold green" if r.name == report.chosen else (None if r.within_tolerance else "dim")
        table.add_row(*_row(report, r), style=style)
    console.print(table)
    for s in report.skipped:
        console.print(f"[yellow]skipped[/] {s.name}: {s.reason}")
    console.print(f"[bold]{'chosen' if report.chosen else 'no change'}:[/] {report.reason}")
    if report.registered:
        reg = report.registered
        console.print(f"registered as [bold]{reg['model']}[/] version {reg['version']}")


def to_markdown(report: OptimizeReport) -> str:
    lines = [f"### redline optimize: `{report.model}`"
             + (f" v{report.version}" if report.version else ""), "",
             f"{report.eval_rows} evaluation rows ({report.tune_rows} used for tuning), "
             f"tolerance {report.tolerance:.2%} relative {report.metric}; latency measured "
             "interleaved in one run.", ""]
    headers = _headers(report)
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(headers) - 2) + ["---"]) + "|")
    for r in report.results:
        cells = _row(report, r)
        if r.name == report.chosen:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    if report.skipped:
        lines += ["", "Skipped:", ""]
        lines += [f"- `{s.name}`: {s.reason}" for s in report.skipped]
    lines += ["", f"**{'Chosen' if report.chosen else 'No change'}:** {report.reason}"]
    if report.registered:
        lines.append(f"Registered as `{report.registered['model']}` version "
                     f"{report.registered['version']}.")
    return "\n".join(lines) + "\n"


def write_reports(report: OptimizeReport, json_path: str | None, markdown_path: str | None) -> None:
    if json_path:
        Path(json_path).write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    if markdown_path:
        Path(markdown_path).write_text(to_markdown(report))
