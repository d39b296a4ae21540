"""`make` installs into this checkout's own environment only: a clone whose .venv links to
another checkout's venv (or whose editable redline lives elsewhere) uses it as it is, so `make
bench` from the clone never points the other checkout's venv at the clone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/bin/sh
here=$(dirname "$0")
echo "$*" >> "$here/../calls.log"
case "$*" in *find_spec*) cat "$here/../origin" 2>/dev/null ;; esac
exit 0
"""


def _venv(folder: Path, origin: str = "") -> Path:
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    (folder / "origin").write_text(origin)
    return folder


def _make_stamp(checkout: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", ".venv/.dev-installed"],
                          cwd=checkout, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_installs_only_into_this_checkouts_own_environment(tmp_path: Path) -> None:
    def checkout(name: str) -> Path:
        folder = tmp_path / name
        (folder / "src").mkdir(parents=True)
        shutil.copy(ROOT / "Makefile", folder / "Makefile")
        (folder / "pyproject.toml").write_text("[project]\nname = 'redline'\n")
        return folder

    # A clone whose .venv links to another checkout's environment: used as it is.
    other = _venv(tmp_path / "other" / ".venv", str(tmp_path / "other" / "src" / "redline"))
    linked = checkout("linked")
    (linked / ".venv").symlink_to(other)
    done = _make_stamp(linked)
    assert done.returncode == 0, done.stderr
    assert "not installing" in done.stdout
    assert "-m pip" not in (other / "calls.log").read_text()
    assert not (other / ".dev-installed").exists()

    # A venv whose editable redline lives in another tree: used as it is, too.
    foreign = checkout("foreign")
    _venv(foreign / ".venv", "/elsewhere/src/redline/__init__.py")
    assert "not installing" in _make_stamp(foreign).stdout
    assert "install -e" not in (foreign / ".venv" / "calls.log").read_text()

    # This checkout's own venv, empty or editable here: installed into, stamps written.
    for origin in ("", "{checkout}/src/redline/__init__.py"):
        own = checkout(f"own{len(origin)}")
        _venv(own / ".venv", origin.format(checkout=own))
        done = _make_stamp(own)
        assert done.returncode == 0, done.stderr
        assert "install -e .[dev,torch]" in (own / ".venv" / "calls.log").read_text()
        assert (own / ".venv" / ".dev-installed").exists()
        assert (own / ".venv" / ".demo-installed").exists()
