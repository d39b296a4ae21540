"""docs/settings.md is written from config/settings.py; every setting says what it is for."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from redline.settings_reference import field_comments, reference

PAGE = Path(__file__).parents[1] / "docs" / "settings.md"
REGENERATE = "python -m redline.settings_reference > docs/settings.md"


def _rows(text: str) -> dict[str, str]:
    """Each setting's key -> its "what it is for" cell."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"\| `([^`]+)` \|", line)
        if match:
            cells = re.split(r"(?<!\\)\|", line)  # an escaped \| stays inside its cell
            rows[match.group(1)] = cells[-2].strip()
    return rows


def test_the_page_is_what_config_py_says():
    assert PAGE.read_text() == reference(), (
        f"docs/settings.md differs from src/redline/config/settings.py: run `{REGENERATE}`")


def test_every_setting_says_what_it_is_for():
    rows = _rows(reference())
    assert "server.http_port" in rows and "models.<name>.slo_ms" in rows
    bare = sorted(key for key, meaning in rows.items() if not meaning)
    assert not bare, (
        f"settings without a comment in src/redline/config/settings.py: {', '.join(bare)}; "
        f"give each a short comment on its line (or the lines just above it), then run "
        f"`{REGENERATE}`")


def test_every_section_says_what_it_is_for():
    sections = re.split(r"\n## ", reference())[1:]
    bare = [s.split("\n", 1)[0] for s in sections
            if s.split("\n", 1)[0] != "top level" and s.split("\n")[2].startswith("| key")]
    assert not bare, (f"settings sections without a class docstring in config/settings.py: "
                      f"{bare}; give each a one-line docstring, then run `{REGENERATE}`")


@dataclass
class _Example:
    plain: int = 1  # on its line
    after_code: int = 2
    # above it,
    # on two lines
    above: int = 3


def test_a_comment_is_the_one_on_the_line_or_the_block_just_above():
    # after_code has none: the comment on the line above belongs to that line's field
    assert field_comments(_Example) == {
        "plain": "on its line", "after_code": "", "above": "above it, on two lines",
    }
