"""The machine-written tables of docs/performance.md: markers, targets and spreads.

An area's table sits between ``<!-- bench:AREA:start -->`` and ``<!-- bench:AREA:end -->``;
``make bench`` replaces what is between them and leaves every other line of the page as it is.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

_MARKER = re.compile(r"^<!-- bench:([\w-]+):(start|end) -->$", re.MULTILINE)


class PageError(ValueError):
    """The page's markers are missing, repeated or out of order."""


def areas(page: str) -> list[str]:
    """The areas the page has markers for, in page order; checks that each pair is well formed."""
    found: list[str] = []
    open_area: str | None = None
    for match in _MARKER.finditer(page):
        area, kind = match.group(1), match.group(2)
        if kind == "start":
            if open_area is not None:
                raise PageError(f"bench:{area}:start inside bench:{open_area}: close it first")
            if area in found:
                raise PageError(f"bench:{area} appears twice: keep one pair of markers")
            open_area = area
        else:
            if open_area != area:
                raise PageError(f"bench:{area}:end without its bench:{area}:start")
            found.append(area)
            open_area = None
    if open_area is not None:
        raise PageError(f"bench:{open_area}:start has no bench:{open_area}:end")
    return found


def replace_block(page: str, area: str, body: str) -> str:
    """The page with ``body`` between the area's markers (the markers themselves kept)."""
    if area not in areas(page):
        raise PageError(f"no bench:{area} markers in the page: add "
                        f"'<!-- bench:{area}:start -->' and '<!-- bench:{area}:end -->'")
    start = re.search(rf"^<!-- bench:{re.escape(area)}:start -->\n", page, re.MULTILINE)
    end = re.search(rf"^<!-- bench:{re.escape(area)}:end -->$", page, re.MULTILINE)
    assert start is not None and end is not None  # areas() checked both
    return f"{page[:start.end()]}{body.rstrip()}\n{page[end.start():]}"


@dataclass(frozen=True)
class Target:
    """A bound a measured value must meet: ``value op bound`` (op ``<=`` or ``>=``)."""

    name: str
    op: str
    bound: float
    value: float
    unit: str = "x"
    spread: str = ""  # the value's lowest–highest over rounds, when it has rounds

    @property
    def met(self) -> bool:
        return self.value <= self.bound if self.op == "<=" else self.value >= self.bound

    def verdict(self) -> str:
        """``met`` or ``not met``, and by how much (the distance to the bound, in its unit)."""
        margin = abs(self.value - self.bound)
        return f"{'met' if self.met else 'not met'} by {number(margin)}{self.unit}"

    def row(self) -> str:
        return (f"| {self.name} {self.op} {number(self.bound)}{self.unit} | "
                f"{number(self.value)}{self.unit} | {self.spread or '—'} | {self.verdict()} |")


def targets_table(targets: Sequence[Target]) -> list[str]:
    return ["| target | measured (median) | min–max over rounds | verdict |",
            "| --- | --- | --- | --- |", *(t.row() for t in targets)]


def number(value: float) -> str:
    """A figure as the page prints it: three significant decimals under 10, grouped above."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def spread(values: Sequence[float]) -> str:
    """``median (min–max)`` over rounds; one value alone is printed as it is."""
    if len(values) == 1:
        return number(values[0])
    return (f"{number(statistics.median(values))} "
            f"({number(min(values))}–{number(max(values))})")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]
