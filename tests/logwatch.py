"""What the suite's servers log, checked after every test phase: an ERROR (or CRITICAL) record,
a logged traceback or a ``Traceback`` in a child process's output fails the test, unless the
test allows it by pattern (``@pytest.mark.allow_log(regex, ...)`` or the ``allow_log``
fixture) because it provokes that error on purpose.

In-process servers need nothing: every log record the process creates is seen (a record factory,
so loggers that do not propagate to the root, like uvicorn's, are covered too). A helper that
starts a child process hands its output to :func:`watch_file` (a log file it keeps writing) or
:func:`check_output` (output read once); both are checked with the same rules.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

TRACEBACK = "Traceback (most recent call last)"
# A level at the start of a line: ``redline serve``'s and its workers' format ("<date> <time>
# ERROR ...") and uvicorn's own ("ERROR:    ...").
_LEVEL_LINE = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ )?(?:ERROR|CRITICAL)\b", re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    """One error or traceback: where it was seen and its text (message and traceback)."""

    source: str
    text: str

    def __str__(self) -> str:
        return f"[{self.source}]\n{self.text.rstrip()}"


def findings_in_text(text: str, source: str) -> list[Finding]:
    """Each traceback block and each ERROR/CRITICAL line of a process's output, in order."""
    found: list[Finding] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if TRACEBACK in line:
            block = [line]
            i += 1
            # the frames are indented; the exception's own line(s) end the block
            while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
                block.append(lines[i])
                i += 1
            if i < len(lines):
                block.append(lines[i])
                i += 1
            found.append(Finding(source, "\n".join(block)))
            continue
        if _LEVEL_LINE.match(line):
            found.append(Finding(source, line))
        i += 1
    return found


def _record_text(record: logging.LogRecord) -> str:
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string is itself worth showing
        message = f"{record.msg!r} % {record.args!r}"
    text = f"{record.levelname} {record.name}: {message}"
    if record.exc_info and record.exc_info[1] is not None:
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    elif record.exc_text:
        text += "\n" + record.exc_text
    return text


class LogWatch:
    """The findings of the running test: records created in this process, and the watched
    outputs of child processes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._findings: list[Finding] = []
        self._files: dict[Path, tuple[str, int]] = {}
        self._installed = False

    def install(self) -> None:
        """See every record at creation, whatever handlers and propagation do with it."""
        if self._installed:
            return
        make = logging.getLogRecordFactory()

        def factory(*args: object, **kwargs: object) -> logging.LogRecord:
            record = make(*args, **kwargs)
            if record.levelno >= logging.ERROR or (
                    record.exc_info and record.levelno >= logging.WARNING):
                finding = Finding("log", _record_text(record))
                with self._lock:
                    self._findings.append(finding)
            return record

        logging.setLogRecordFactory(factory)
        self._installed = True

    def watch_file(self, path: Path, source: str) -> None:
        """Check what ``path`` gains from now on (it may not exist yet)."""
        with self._lock:
            self._files[Path(path)] = (source, 0)

    def add_text(self, text: str, source: str) -> None:
        found = findings_in_text(text, source)
        with self._lock:
            self._findings.extend(found)

    def _read_files(self) -> None:
        with self._lock:
            files = dict(self._files)
        for path, (source, offset) in files.items():
            try:
                with path.open("rb") as f:
                    if path.stat().st_size < offset:
                        offset = 0  # written anew
                    f.seek(offset)
                    data = f.read()
            except OSError:  # not written yet, or its folder is gone
                continue
            # only whole lines: a line being written is read at the next check
            end = data.rfind(b"\n") + 1
            if end:
                self.add_text(data[:end].decode(errors="replace"), source)
                with self._lock:
                    if path in self._files:
                        self._files[path] = (source, offset + end)

    def take(self) -> list[Finding]:
        """Everything found since the last call."""
        self._read_files()
        with self._lock:
            found, self._findings = self._findings, []
        return found


WATCH = LogWatch()


def watch_file(path: Path, source: str | None = None) -> None:
    """Check a child process's log file after each test phase, from its current start."""
    WATCH.watch_file(path, source or Path(path).name)


def check_output(text: str | bytes | None, source: str) -> None:
    """Check output read from a child process (checked at the end of the test phase)."""
    if text:
        WATCH.add_text(text.decode(errors="replace") if isinstance(text, bytes) else text,
                       source)


def unexpected(found: Iterable[Finding], allowed: Iterable[str]) -> list[Finding]:
    patterns = [re.compile(p) for p in allowed]
    return [f for f in found if not any(p.search(f.text) for p in patterns)]


def log_to(path: Path, source: str | None = None) -> BinaryIO:
    """A new file for a child process's output, watched from now on: pass it as ``stdout`` (with
    ``stderr=subprocess.STDOUT``) and close it once the process has started."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = path.open("wb")
    watch_file(path, source)
    return out


_LOG_DIR: Path | None = None


def _new_log(source: str) -> Path:
    global _LOG_DIR
    if _LOG_DIR is None:
        _LOG_DIR = Path(tempfile.mkdtemp(prefix="redline-test-logs-"))
    fd, name = tempfile.mkstemp(prefix=re.sub(r"\W+", "-", source)[:40] + "-", suffix=".log",
                                dir=_LOG_DIR)
    os.close(fd)
    return Path(name)


def remove_logs() -> None:
    if _LOG_DIR is not None:
        shutil.rmtree(_LOG_DIR, ignore_errors=True)


class LoggedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """A child process whose output goes to a watched log file (``log``, ``log_text()``):
    stdout and stderr both, or only stderr when the caller pipes stdout (to read a result)."""

    def __init__(self, args: list[str], *, source: str, log: Path | None = None,
                 stdout: Any = None, **kwargs: Any) -> None:
        self.log = Path(log) if log is not None else _new_log(source)
        with log_to(self.log, source) as out:
            if stdout is None:
                super().__init__(args, stdout=out, stderr=subprocess.STDOUT, **kwargs)
            else:
                super().__init__(args, stdout=stdout, stderr=out, **kwargs)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")
