"""Run ``redline`` in this process as a user would, for the model commands' tests."""

from __future__ import annotations

import pytest

from redline.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``redline ARGS``: its exit code, what it printed and what it wrote to stderr."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err
