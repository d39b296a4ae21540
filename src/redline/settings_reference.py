"""docs/settings.md, written from ``config/settings.py``: every setting with its default, what it
accepts and what it is for, so the reference cannot drift from the code.

The meaning of a setting is the comment next to its field in ``config/settings.py`` (on its line,
or the lines just above it); a section's meaning is its class docstring.
``tests/test_settings_reference.py`` fails when docs/settings.md differs from what this writes;
run ``python -m redline.settings_reference > docs/settings.md`` after changing a setting.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys
import tokenize
import typing
from typing import Any

from redline.config import ModelSettings, Settings

HEADER = """# Settings reference

Every key of `redline.yaml`, its default and what it accepts. Written from
`src/redline/config/settings.py` by `python -m redline.settings_reference > docs/settings.md` (a
test keeps the two equal); how the layers combine (defaults, the file,
`REDLINE_<SECTION>__<KEY>` variables, command-line options) is in
[operations.md](operations.md#configuration-redlineyaml-environment-options).

A value outside what a setting accepts is refused at start with the file's line, as a wrong type
is: `redline.yaml:4: 'batching.max_batch_size' must be at least 1, got -5`. Numbers must be finite.
Under `models.<name>` the keys below override the top-level ones for that model.
"""


def field_comments(cls: type) -> dict[str, str]:
    """The comment of each field of dataclass ``cls``: the one on its line, else the block of
    comment lines directly above it."""
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}  # line -> comment text
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(tok.start[0])
    out: dict[str, str] = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for number, line in enumerate(source.splitlines(), start=1):
        name = line.strip().split(":", 1)[0]
        if name not in names or name in out or line.strip().startswith("#"):
            continue
        if number in comments:
            out[name] = comments[number]
            continue
        above: list[str] = []
        at = number - 1
        while at in comments and at not in code_lines:
            above.insert(0, comments[at])
            at -= 1
        out[name] = " ".join(above)
    return out


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return ""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, list | dict) and not value:
        return "`[]`" if isinstance(value, list) else "`{}`"
    return f"`{value}`"


def _section(cls: type, prefix: str) -> tuple[list[str], list[tuple[type, str]]]:
    """The table rows of ``cls``'s plain fields, and its nested sections to write after it."""
    hints = typing.get_type_hints(cls)
    rules = getattr(cls, "RULES", {})
    notes = field_comments(cls)
    rows: list[str] = []
    nested: list[tuple[type, str]] = []
    for f in dataclasses.fields(cls):
        if cls is Settings and f.name == "source":
            continue  # where the settings came from: set by the loader, not by a user
        hint = hints[f.name]
        inner = [a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a)]
        if f.name == "models":
            nested.append((ModelSettings, "models.<name>."))
            continue
        if inner and not prefix.startswith("models."):
            nested.append((inner[0], f"{prefix}{f.name}."))  # type: ignore[arg-type]
            continue
        accepts = str(rules[f.name]) if f.name in rules else ""
        if f.metadata.get("path"):
            accepts = (accepts + "; " if accepts else "") + "a path (relative to the file)"
        meaning = notes.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{prefix}{f.name}` | {_default(f)} | {accepts} | {meaning} |")
    return rows, nested


def reference() -> str:
    """The text of docs/settings.md."""
    parts = [HEADER]
    queue: list[tuple[type, str]] = [(Settings, "")]
    while queue:
        cls, prefix = queue.pop(0)
        rows, nested = _section(cls, prefix)
        title = prefix.rstrip(".") or "top level"
        doc = cls.__doc__ or ""
        if doc.startswith(f"{cls.__name__}("):  # the signature dataclass writes: no docstring
            doc = ""
        parts.append(f"\n## {title}\n")
        if doc and cls is not Settings:
            parts.append(" ".join(doc.split()) + "\n")
        if rows:
            parts.append("| key | default | accepts | what it is for |\n| --- | --- | --- | --- |")
            parts.extend(rows)
        queue.extend(nested)
    return "\n".join(parts) + "\n"


if __name__ == "__main__":  # python -m redline.settings_reference > docs/settings.md
    sys.stdout.write(reference())
