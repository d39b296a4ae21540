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
from redline.optimize.profile import METRIC_DIRECTION
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
    if r.tied_with and r.within_tolerance:
        return f"as fast as {r.tied_with} (within noise)"
    return {"ok": "ok", "too lossy": "too lossy", "guard": f"{report.guard_metric} worse",
            "uncertain": "too few rows to tell"}.get(r.verdict, r.verdict)


def _ci(value: float | None, ci: Interval | None, fmt: str) -> str:
    if value is None or not np.isfinite(value):
        return "-"
    text = format(value + 0.0, fmt)  # + 0.0: no "-0.00%"
    if ci is not None and np.isfinite(ci.low):
        text += f" [{format(ci.low + 0.0, fmt)}, {format(ci.high + 0.0, fmt)}]"
    return text


def _speed(r: CandidateResult, batch: int) -> str:
    ci = r.speedup_interval.get(batch)
    text = f"{r.speedup[batch]:.2f}x"
    if r.name == "original" or ci is None:
        return text
    high = f"{ci.high:.2f}" if np.isfinite(ci.high) else "∞"
    return f"{text} [{ci.low:.2f}, {high}]"


def _change(loss: float | None, ci: Interval | None, direction: int) -> str:
    """A relative loss as the signed change of the metric itself (+ means it went up)."""
    if loss is None:
        return "-"
    sign = -direction  # loss = -change for higher-is-better, +change for lower-is-better
    interval = None if ci is None else Interval(*sorted((sign * ci.low, sign * ci.high)))
    return _ci(sign * loss, interval, "+.2%")


def _row(report: OptimizeReport, r: CandidateResult) -> list[str]:
    small, big = min(report.batch_sizes), max(report.batch_sizes)
    metric = r.metrics.get(report.metric)
    ev = r.evaluation
    cells = [
        r.name,
        f"{r.latency[small].p50_us:.1f}", f"{r.latency[small].p99_us:.1f}",
        f"{r.latency[big].p50_us:.1f}", f"{r.latency[big].p99_us:.1f}",
        f"{r.latency[big].per_row_us:.2f}",
        _speed(r, small), _speed(r, big),
        f"{r.size_bytes / 1024:.1f}",
        _ci(metric, r.intervals.get(report.metric), ".4f"),
        _change(ev.loss, ev.interval, _direction(report, report.metric)),
    ]
    if report.guard_metric:
        cells.append(_change(ev.guard_loss, ev.guard_interval,
                             _direction(report, report.guard_metric)))
    out_diff = "-" if np.isnan(r.max_abs_diff) else f"{r.max_abs_diff:.2g}"
    cells += [out_diff, f"{r.disagreement:.2%}", _status(report, r)]
    return cells


def _direction(report: OptimizeReport, metric: str) -> int:
    """+1 when higher is better; a user's metric says its own direction."""
    if metric in METRIC_DIRECTION:
        return METRIC_DIRECTION[metric]
    return report.metric_direction


def _better(direction: int) -> str:
    return "higher is better" if direction > 0 else "lower is better"


def _headers(report: OptimizeReport) -> list[str]:
    small, big = min(report.batch_sizes), max(report.batch_sizes)
    heads = ["candidate", f"p50@{small} µs", f"p99@{small} µs", f"p50@{big} µs",
             f"p99@{big} µs", f"µs/row@{big}", f"speed-up@{small} [95% CI]",
             f"speed-up@{big} [95% CI]", "size KiB", f"{report.metric} [95% CI]",
             f"{report.metric} change, {_better(_direction(report, report.metric))} [95% CI]"]
    if report.guard_metric:
        direction = _direction(report, report.guard_metric)
        heads.append(f"{report.guard_metric} change, {_better(direction)} [95% CI]")
    moved = "changed rows" if report.task == "classification" else "Δout / spread"
    return heads + ["max abs Δout", moved, "status"]


def _intro(report: OptimizeReport) -> str:
    rows = report.rows
    guard = (f" and at most {report.guard_tolerance:.2%} relative {report.guard_metric} loss"
             if report.guard_metric and report.guard_tolerance is not None else "")
    return (f"{rows['evaluation']} evaluation rows (figures below), {rows['choice']} choice rows "
            f"(the pick), {rows['fit']} fit rows (calibration, fine-tuning); tolerance "
            f"{report.tolerance:.2%} relative {report.metric}{guard}, judged by the worse end of "
            f"the 95% bootstrap interval; changes are signed: candidate against the original. "
            f"Latency: {report.measurement}; speed-ups are paired pass by pass, with a 95% "
            f"interval whose lower end must reach the threshold."
            + (f" Contract every candidate keeps: {report.contract.describe()}."
               if report.contract else ""))


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
