"""Show an optimize run: progress while it works, a table that fits the screen, JSON and
Markdown with every figure.

Progress goes to stderr: a bar on a terminal, and in a log (CI, a pipe) one line per step —
a candidate built, evaluated or timed — so a long run never sits silent. The terminal table
keeps the columns a decision needs, as many as fit its width; the Markdown and JSON reports
hold all of them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from redline.optimize.optimizer import CandidateResult, OptimizeReport
from redline.optimize.profile import METRIC_DIRECTION
from redline.optimize.uncertainty import Interval


class RichProgress:
    """The ``Progress`` protocol of the optimizer, drawn as a bar with rich (a terminal)."""

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

    def advance(self, n: int = 1, detail: str = "") -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)


class LineProgress:
    """The ``Progress`` protocol as plain lines (a CI log, a pipe): one per step, with the time
    since the start, written as it happens."""

    def __init__(self, stream: IO[str], clock: Callable[[], float] = time.monotonic) -> None:
        self._stream, self._clock = stream, clock
        self._started = clock()
        self._label, self._done = "", 0
        self._total: int | None = None

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.flush()

    def stage(self, label: str, total: int | None = None) -> None:
        if total is not None or not self._label:
            self._label, self._done, self._total = label, 0, total
            self._line(label + (f" ({total} steps)" if total else ""))
        else:
            self._line(label)

    def advance(self, n: int = 1, detail: str = "") -> None:
        self._done += n
        count = f" {self._done}/{self._total}" if self._total else ""
        self._line(f"{self._label}{count}" + (f": {detail}" if detail else ""))

    def _line(self, text: str) -> None:
        self._stream.write(f"[{self._clock() - self._started:6.1f}s] {text}\n")
        self._stream.flush()


def stderr_progress() -> RichProgress | LineProgress:
    """A bar when stderr is a terminal, progress lines when it is a log or a pipe."""
    console = Console(stderr=True)
    return RichProgress(console) if console.is_terminal else LineProgress(console.file)


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


def _change(loss: float | None, ci: Interval | None, direction: int,
            compact: bool = False) -> str:
    """A relative loss as the signed change of the metric itself (+ means it went up);
    ``compact``: in percent without the signs (the screen's header says "%")."""
    if loss is None:
        return "-"
    sign = -direction  # loss = -change for higher-is-better, +change for lower-is-better
    interval = None if ci is None else Interval(*sorted((sign * ci.low, sign * ci.high)))
    if compact:
        scaled = None if interval is None else Interval(interval.low * 100, interval.high * 100)
        return _ci(sign * loss * 100, scaled, "+.2f")
    return _ci(sign * loss, interval, "+.2%")


@dataclass(frozen=True)
class _Column:
    header: str  # in the Markdown report
    short: str  # on a screen, where the intro below the table says the rest
    cell: Callable[[CandidateResult], str]
    priority: int  # lower: kept first when the screen is narrow
    wrap: bool = False  # only free text may break over lines; numbers and names never
    screen: Callable[[CandidateResult], str] | None = None  # a shorter cell, if any

    def shown(self, r: CandidateResult) -> str:
        return (self.screen or self.cell)(r)


def _columns(report: OptimizeReport) -> list[_Column]:
    """Every column, in reading order; the Markdown report has all, a screen those that fit."""
    small, big = min(report.batch_sizes), max(report.batch_sizes)
    metric, guard = report.metric, report.guard_metric
    moved = "changed rows" if report.task == "classification" else "Δout / spread"

    def change(name: str, rows: str, compact: bool = False) -> Callable[[CandidateResult], str]:
        def cell(r: CandidateResult) -> str:
            j = r.choice if rows == "choice" else r.evaluation
            loss, ci = (j.loss, j.interval) if name == metric else (j.guard_loss,
                                                                      j.guard_interval)
            return _change(loss, ci, _direction(report, name), compact)
        return cell

    def delta(name: str, rows: str, short: str, priority: int) -> _Column:
        label = "choice rows (verdict)" if rows == "choice" else "evaluation rows"
        return _Column(f"{name} change, {label}, {_better(_direction(report, name))} [95% CI]",
                       f"{name} Δ%, {short}", change(name, rows), priority,
                       screen=change(name, rows, compact=True))

    cols = [
        _Column("candidate", "candidate", lambda r: r.name, 0),
        _Column(f"p50@{small} µs", f"p50@{small} µs",
                lambda r: f"{r.latency[small].p50_us:.1f}", 7),
        _Column(f"p99@{small} µs", f"p99@{small} µs",
                lambda r: f"{r.latency[small].p99_us:.1f}", 12),
        _Column(f"p50@{big} µs", f"p50@{big} µs", lambda r: f"{r.latency[big].p50_us:.1f}", 6),
        _Column(f"p99@{big} µs", f"p99@{big} µs", lambda r: f"{r.latency[big].p99_us:.1f}", 11),
        _Column(f"µs/row@{big}", f"µs/row@{big}",
                lambda r: f"{r.latency[big].per_row_us:.2f}", 13),
        _Column(f"speed-up@{small} [95% CI]", f"speed-up@{small}", lambda r: _speed(r, small),
                4),
        _Column(f"speed-up@{big} [95% CI]", f"speed-up@{big}", lambda r: _speed(r, big), 3),
        _Column("size KiB", "KiB", lambda r: f"{r.size_bytes / 1024:.1f}", 9),
        _Column(f"{metric}, evaluation rows [95% CI]", f"{metric}, eval rows",
                lambda r: _ci(r.metrics.get(metric), r.intervals.get(metric), ".4f"), 14),
        # the verdict's own figures: choice rows, by the interval's worse end
        delta(metric, "choice", "choice rows (verdict)", 2),
    ]
    if guard:
        cols.append(delta(guard, "choice", "choice rows (verdict)", 5))
    cols.append(delta(metric, "evaluation", "eval rows", 8))
    if guard:
        cols.append(delta(guard, "evaluation", "eval rows", 10))
    cols += [
        _Column("max abs Δout", "max |Δout|",
                lambda r: "-" if np.isnan(r.max_abs_diff) else f"{r.max_abs_diff:.2g}", 15),
        _Column(moved, moved, lambda r: f"{r.disagreement:.2%}", 16),
        _Column("status", "status", lambda r: _status(report, r), 1, wrap=True),
    ]
    return cols


def _row(report: OptimizeReport, r: CandidateResult) -> list[str]:
    return [c.cell(r) for c in _columns(report)]


def _direction(report: OptimizeReport, metric: str) -> int:
    """+1 when higher is better; a user's metric says its own direction."""
    if metric in METRIC_DIRECTION:
        return METRIC_DIRECTION[metric]
    return report.metric_direction


def _better(direction: int) -> str:
    return "higher is better" if direction > 0 else "lower is better"


def _headers(report: OptimizeReport) -> list[str]:
    return [c.header for c in _columns(report)]


def _intro(report: OptimizeReport) -> str:
    rows = report.rows
    guard = (f" and at most {report.guard_tolerance:.2%} relative {report.guard_metric} loss"
             if report.guard_metric and report.guard_tolerance is not None else "")
    return (f"Rows: {rows['choice']} choice rows decide each candidate's status (the "
            f"'choice rows (verdict)' columns), {rows['evaluation']} evaluation rows give every "
            f"other figure and confirm the pick, {rows['fit']} fit rows (calibration, "
            f"fine-tuning) judge nothing. Tolerance {report.tolerance:.2%} relative "
            f"{report.metric}{guard}, by the worse end of the 95% bootstrap interval; changes "
            f"are signed: candidate against the original. Latency: {report.measurement}; "
            f"speed-ups are paired pass by pass, with a 95% interval whose lower end must reach "
            f"the threshold."
            + (f" Contract every candidate keeps: {report.contract.describe()}."
               if report.contract else ""))


_GAP = 3  # characters between two columns: padding, a blank rule, padding
_STATUS_MIN = 10  # the status wraps, but not narrower than this


def _widths(report: OptimizeReport, columns: list[_Column]) -> dict[str, int]:
    """Each column's width: its longest cell (cells never break) or its header's longest word
    (headers wrap at spaces); the status, which wraps, at its narrowest."""
    widths = {}
    for c in columns:
        cells = [c.shown(r) for r in report.results]
        longest = max((len(t) for t in cells), default=1)
        word = max(len(w) for t in cells for w in t.split()) if c.wrap else 0
        header = max(len(w) for w in c.short.split())
        widths[c.header] = max(max(_STATUS_MIN, word) if c.wrap else longest, header)
    return widths


def _fitting(report: OptimizeReport, width: int) -> tuple[list[_Column], list[_Column]]:
    """The columns that fit ``width`` characters, by priority (the rest are left out)."""
    columns = _columns(report)
    widths = _widths(report, columns)
    kept: list[_Column] = []
    for c in sorted(columns, key=lambda c: c.priority):
        used = sum(widths[k.header] + _GAP for k in [*kept, c]) - _GAP
        if c.priority == 0 or used <= width:
            kept.append(c)
    return [c for c in columns if c in kept], [c for c in columns if c not in kept]


def _table(report: OptimizeReport, columns: list[_Column], width: int) -> Table:
    widths = _widths(report, columns)
    spare = width - (sum(widths.values()) + _GAP * (len(columns) - 1))
    table = Table(title=f"redline optimize: {report.model}"
                  + (f" v{report.version}" if report.version else ""),
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for c in columns:
        w = widths[c.header]
        if c.wrap:  # the status takes what is left, up to its longest text
            w = max(w, min(max(len(c.shown(r)) for r in report.results), w + max(spare, 0)))
        table.add_column(c.short, justify="left" if c.wrap or c.priority == 0 else "right",
                         width=w)
    for r in report.results:
        style = "bold green" if r.name == report.chosen else (None if r.within_tolerance else "dim")
        table.add_row(*[c.shown(r) for c in columns], style=style)
    return table


def _legend(report: OptimizeReport) -> str:
    """What the screen's short headers leave out."""
    directions = ", ".join(f"{m}: {_better(_direction(report, m))}"
                           for m in (report.metric, report.guard_metric) if m)
    return (f"[low, high]: 95% intervals. Δ%: the metric's change in percent, candidate "
            f"against the original ({directions}).")


def terminal_console() -> Console:
    """The screen's width on a terminal; in a log, the width of a terminal (COLUMNS, else 80)."""
    return Console()


def print_report(report: OptimizeReport, console: Console | None = None) -> None:
    console = console or terminal_console()
    shown, left_out = _fitting(report, console.width)
    console.print(_table(report, shown, console.width))
    console.print(_legend(report) + " " + _intro(report), markup=False, highlight=False)
    if left_out:
        console.print(f"Left out to fit {console.width} columns: "
                      + "; ".join(c.short for c in left_out)
                      + ". Every column is in the Markdown (--markdown) and JSON (--json-out) "
                      "reports.", markup=False, highlight=False)
    for s in [*report.rejected, *report.skipped]:
        console.print(f"[yellow]{'rejected' if s in report.rejected else 'skipped'}[/] "
                      f"{escape(s.name)}: {escape(s.reason)}", highlight=False)
    console.print(f"[bold]{'chosen' if report.chosen else 'no change'}:[/] "
                  f"{escape(report.reason)}", highlight=False)
    if report.registered:
        reg = report.registered
        console.print(f"registered as [bold]{escape(str(reg['model']))}[/] version "
                      f"{reg['version']}"
                      + ("" if reg.get("fallback") else
                         f" — not serving until promoted: redline models promote -m "
                         f"{escape(str(reg['model']))} --version {reg['version']}, or redline "
                         "gate --promote production"), highlight=False)


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
