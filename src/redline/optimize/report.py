"""Show an optimize run: a progress bar while it works, a table on screen, JSON and Markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from redline.optimize.optimizer import CandidateResult, OptimizeReport
from redline.optimize.uncertainty import Interval


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


def _status(report: OptimizeReport, r: CandidateResult) -> str:
    if r.name == "original":
        return "baseline"
    if r.name == report.chosen:
        return "chosen"
    return {"ok": "ok", "too lossy": "too lossy", "guard": f"{report.guard_metric} worse",
            "uncertain": "too few rows to tell"}.get(r.verdict, r.verdict)


def _ci(value: float | None, ci: Interval | None, fmt: str) -> str:
    if value is None or not np.isfinite(value):
        return "-"
    text = format(value + 0.0, fmt)  # + 0.0: no "-0.00%"
    if ci is not None and np.isfinite(ci.low):
        text += f" [{format(ci.low + 0.0, fmt)}, {format(ci.high + 0.0, fmt)}]"
    return text


def _row(report: OptimizeReport, r: CandidateResult) -> list[str]:
    small, big = min(report.batch_sizes), max(report.batch_sizes)
    metric = r.metrics.get(report.metric)
    ev = r.evaluation
    cells = [
        r.name,
        f"{r.latency[small].p50_us:.1f}", f"{r.latency[small].p99_us:.1f}",
        f"{r.latency[big].p50_us:.1f}", f"{r.latency[big].p99_us:.1f}",
        f"{r.latency[big].per_row_us:.2f}",
        f"{r.speedup[small]:.2f}x", f"{r.speedup[big]:.2f}x",
        f"{r.size_bytes / 1024:.1f}",
        _ci(metric, r.intervals.get(report.metric), ".4f"),
        _ci(-ev.loss, Interval(-ev.interval.high, -ev.interval.low), "+.2%"),
    ]
    if report.guard_metric:
        g, gi = ev.guard_loss, ev.guard_interval
        cells.append(_ci(None if g is None else -g,
                         None if gi is None else Interval(-gi.high, -gi.low), "+.2%"))
    cells += [f"{r.max_abs_diff:.2g}", f"{r.disagreement:.2%}", _status(report, r)]
    return cells


def _headers(report: OptimizeReport) -> list[str]:
    small, big = min(report.batch_sizes), max(report.batch_sizes)
    heads = ["candidate", f"p50@{small} µs", f"p99@{small} µs", f"p50@{big} µs",
             f"p99@{big} µs", f"µs/row@{big}", f"speed-up@{small}", f"speed-up@{big}",
             "size KiB", f"{report.metric} [95% CI]", f"Δ{report.metric} [95% CI]"]
    if report.guard_metric:
        heads.append(f"Δ{report.guard_metric} [95% CI]")
    moved = "changed rows" if report.task == "classification" else "Δout / spread"
    return heads + ["max abs Δout", moved, "status"]


def _intro(report: OptimizeReport) -> str:
    rows = report.rows
    guard = (f" and at most {report.guard_tolerance:.2%} relative {report.guard_metric} loss"
             if report.guard_metric and report.guard_tolerance is not None else "")
    return (f"{rows['evaluation']} evaluation rows (figures below), {rows['choice']} choice rows "
            f"(the pick), {rows['fit']} fit rows (calibration, fine-tuning); tolerance "
            f"{report.tolerance:.2%} relative {report.metric}{guard}, judged by the worse end of "
            f"the 95% bootstrap interval. Latency: {report.measurement}.")


def wide_console() -> Console:
    """A console wide enough for the table even when output is piped (CI logs)."""
    console = Console()
    # Piped (a CI log): wide enough that no cell wraps and no name is cut; logs scroll sideways.
    return console if console.is_terminal and console.width >= 150 else Console(width=400)


def print_report(report: OptimizeReport, console: Console | None = None) -> None:
    console = console or wide_console()
    table = Table(title=f"redline optimize: {report.model}"
                  + (f" v{report.version}" if report.version else ""),
                  caption=_intro(report))
    longest = max((len(r.name) for r in report.results), default=9)
    for i, header in enumerate(_headers(report)):
        if i == 0:  # names are never cut, on a terminal or in a CI log
            table.add_column(header, justify="left", no_wrap=True, min_width=longest)
        else:
            table.add_column(header, justify="left" if header == "status" else "right")
    for r in report.results:
        style = "bold green" if r.name == report.chosen else (None if r.within_tolerance else "dim")
        table.add_row(*_row(report, r), style=style)
    console.print(table)
    for s in [*report.rejected, *report.skipped]:
        console.print(f"[yellow]{'rejected' if s in report.rejected else 'skipped'}[/] "
                      f"{s.name}: {s.reason}", soft_wrap=True)
    console.print(f"[bold]{'chosen' if report.chosen else 'no change'}:[/] {report.reason}",
                  soft_wrap=True)
    if report.registered:
        reg = report.registered
        console.print(f"registered as [bold]{reg['model']}[/] version {reg['version']}"
                      + ("" if reg.get("fallback") else
                         f" — not serving until promoted: redline models promote -m "
                         f"{reg['model']} --version {reg['version']}, or redline gate "
                         "--promote production"), soft_wrap=True)


def _md_cell(text: str) -> str:
    """A table cell: pipes escaped, so the table renders in any CommonMark/GFM renderer."""
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: OptimizeReport) -> str:
    lines = [f"### redline optimize: `{report.model}`"
             + (f" v{report.version}" if report.version else ""), "", _intro(report), ""]
    headers = _headers(report)
    lines.append("| " + " | ".join(_md_cell(h) for h in headers) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(headers) - 2) + ["---"]) + "|")
    for r in report.results:
        cells = [_md_cell(c) for c in _row(report, r)]
        if r.name == report.chosen:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    if report.rejected:
        lines += ["", "Rejected (never measured as valid):", ""]
        lines += [f"- `{s.name}`: {s.reason}" for s in report.rejected]
    if report.skipped:
        lines += ["", "Skipped:", ""]
        lines += [f"- `{s.name}`: {s.reason}" for s in report.skipped]
    lines += ["", f"**{'Chosen' if report.chosen else 'No change'}:** {report.reason}"]
    if report.registered:
        lines.append(f"Registered as `{report.registered['model']}` version "
                     f"{report.registered['version']} (serves only once promoted).")
    return "\n".join(lines) + "\n"


def to_json(report: OptimizeReport) -> str:
    return json.dumps(report.to_dict(), indent=2, default=str) + "\n"


def write_reports(report: OptimizeReport, json_path: str | None, markdown_path: str | None) -> None:
    if json_path:
        Path(json_path).write_text(to_json(report))
    if markdown_path:
        Path(markdown_path).write_text(to_markdown(report))
