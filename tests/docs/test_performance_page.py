"""docs/performance.md stays a results page a reader can take in: bounded in length, every
machine-written table between its markers, and every heading of it that the other docs, the
sources and the tests link to still there."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.bench_page import areas

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "performance.md"
# 320, then the Python models against the peers and both Ray modes, then the serving baseline,
# then the cascade
MAX_LINES = 450
AREAS = ["serving", "mlserver", "v1", "graph", "recommend-ray", "python-peers", "cascade",
         "feature-reads", "ingest", "offline", "feast-offline", "monitoring", "hedging"]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_page_stays_short() -> None:
    lines = len(PAGE.read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"docs/performance.md has {lines} lines, at most {MAX_LINES}: keep one table per area and "
        "a few sentences around it; findings that explain the code belong in "
        "docs/architecture.md or the module's docstring")


def test_every_machine_written_table_keeps_its_markers() -> None:
    assert areas(PAGE.read_text()) == AREAS


def test_links_into_the_page_name_its_headings() -> None:
    page = PAGE.read_text()
    anchors = {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", page, re.MULTILINE)}
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
             *(ROOT / "examples").glob("*/README.md"), *(ROOT / "src").rglob("*.py"),
             *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    links = [(f.relative_to(ROOT), m.group(1)) for f in files
             for m in re.finditer(r"performance\.md#([\w-]+)", f.read_text())]
    assert links, "no file links into docs/performance.md: the pattern above has drifted"
    broken = [f"{path}: #{anchor}" for path, anchor in links if anchor not in anchors]
    assert not broken, f"links to headings docs/performance.md no longer has: {broken}"
