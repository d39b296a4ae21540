"""Run the ```bash and ```python blocks of a Markdown page as a reader would, in order.

Rules the pages follow (and this runner enforces):

* Every fenced block has a language. ``bash`` and ``python`` blocks run; ``text``, ``json``,
  ``yaml`` and the like are shown, not run. A fence without a language is an error (is it a
  command or an output?).
* ``<!-- answer-of: METHOD PATH [BODY_FILE] -->`` on the line right before a ```json block says
  the block is the answer of that request to the demo's server (``BODY_FILE`` relative to the
  project root); test_docs.py sends it and checks that the shown answer has the real one's keys,
  at every depth, so a renamed or dropped field cannot live on in a page.
* ``<!-- not-run: reason -->`` on the line right before a fence skips that one block; the reason
  is required. Keep such blocks few: only what truly cannot run here (Kubernetes, a cloud, a long
  benchmark, ``make demo`` itself).
* The blocks of one page run in ONE bash session, in order, from a fresh copy of the project in
  which a small ``make demo`` has run (``.redline/demo`` holds its inputs): ``cd``, variables and
  background jobs carry from block to block, as in a terminal. README.md and docs/*.md start at
  the project root, ``examples/<name>/README.md`` in its own folder. A python block runs as its own
  ``python`` process (blocks do not share variables).
* A server is started the way a user does it, in the background, then waited for:
  ``redline serve ... &`` then ``curl -s --retry 30 --retry-connrefused --retry-delay 1
  127.0.0.1:8000/v2/health/ready``. Pages that never start one get the demo's server
  (``redline serve --config .redline/demo/redline.yaml``) started for them when a block talks to
  a port. Everything a page started is stopped when it ends.
* The well-known ports are mapped to free ones (8000 REST, 8001 gRPC, 8010 ingest, 6379 Redis:
  the number in the block's text, and ``REDLINE_*`` environment overrides for the defaults), so a
  run never collides with anything else on the machine; a redis-server of the test session
  listens on the one mapped to 6379.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.logwatch import check_output, watch_file

RUN_LANGS = {"bash", "python"}
SHOWN_LANGS = {"text", "json", "yaml", "toml", "ini", "dockerfile", "proto", "protobuf", "promql",
               "console", "http", "diff", "csv", "markdown", "md", "html", "xml", "sql", "lua",
               "mermaid", "jsonl", "output", "log", "sh-session", "none", "python-repl"}
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)\s*(.*)$")
NOT_RUN = re.compile(r"^<!--\s*not-run(?::\s*(.*?))?\s*-->\s*$")
ANSWER_OF = re.compile(r"^<!--\s*answer-of:\s*([A-Z]+)\s+(/\S*)(?:\s+(\S+))?\s*-->\s*$")
SERVER_PORTS = re.compile(r"(?:127\.0\.0\.1|localhost)?:(8000|8001)\b")
BLOCK_TIMEOUT_S = 180.0  # the longest block (the recommender's small shop) on a busy machine


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    text: str
    not_run: str | None = None  # the reason, when marked
    answer_of: tuple[str, str, str | None] | None = None  # (method, path, body file), when marked


@dataclass
class PageProblems:
    errors: list[str] = field(default_factory=list)


def parse(page: Path) -> tuple[list[Block], list[str]]:
    """The page's fenced blocks, and the problems of its markup (untagged fences, no reason)."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence[0] * len(fence)):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        prev = lines[start - 1].strip() if start > 0 else ""
        marker = NOT_RUN.match(prev)
        reason = None
        if marker:
            reason = (marker.group(1) or "").strip()
            if not reason:
                problems.append(f"{start}: `<!-- not-run -->` needs a reason: "
                                "`<!-- not-run: why it cannot run here -->`")
        if not lang:
            problems.append(f"{start + 1}: a fence without a language; use ```bash or "
                            "```python for what runs, ```text (or json, yaml...) for what is "
                            "shown")
        elif lang in ("sh", "shell", "zsh", "console") and not marker:
            problems.append(f"{start + 1}: ```{lang}: use ```bash (runs) or ```text "
                            "(shown)")
        elif lang not in RUN_LANGS and lang not in SHOWN_LANGS and lang not in ("sh", "shell"):
            problems.append(f"{start + 1}: unknown fence language ```{lang}")
        answer = ANSWER_OF.match(prev)
        answer_of = (answer.group(1), answer.group(2), answer.group(3)) if answer else None
        if answer and lang != "json":
            problems.append(f"{start + 1}: `<!-- answer-of -->` marks a ```json block only")
        blocks.append(Block(lang, start + 1, "\n".join(body), reason, answer_of))
    return blocks, problems


def key_paths(doc: object, prefix: str = "") -> set[str]:
    """Every key of a JSON document as a dotted path (``timings_us.total``); a list counts by
    the keys of its first item."""
    paths: set[str] = set()
    if isinstance(doc, dict):
        for key, value in doc.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths.add(path)
            paths |= key_paths(value, path)
    elif isinstance(doc, list) and doc:
        paths |= key_paths(doc[0], f"{prefix}[]")
    return paths


def map_ports(text: str, ports: dict[int, int]) -> str:
    for old, new in ports.items():
        text = re.sub(rf"(?<![\w.]){old}(?!\d)", str(new), text)
    return text


class Shell:
    """One bash session: blocks go in on stdin, a sentinel line says each one finished."""

    SENTINEL = "__redline_doc_block_done__"

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=cwd, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.send("set -eo pipefail")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def run(self, command: str, timeout_s: float) -> tuple[str, str | None]:
        """Run and wait; returns (output, problem or None)."""
        self.send(f"{command}\necho {self.SENTINEL}")
        out: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "".join(out), (f"did not finish in {timeout_s:.0f} s (a server in the "
                                      "foreground? end its line with & and wait for readiness)")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                # bash may have exited while a background job still holds the output pipe
                if self.proc.poll() is not None:
                    line = None
                else:
                    continue
            if line is None:
                code = self.proc.wait(10)
                return "".join(out), f"exited with status {code}"
            if line.rstrip("\n").endswith(self.SENTINEL):  # after output with no newline
                out.append(line.rstrip("\n")[: -len(self.SENTINEL)])
                return "".join(out), None
            out.append(line)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


def starts_server(blocks: list[Block]) -> bool:
    return any("redline serve" in b.text for b in blocks if b.lang == "bash" and not b.not_run)


def needs_server(blocks: list[Block]) -> bool:
    return any(SERVER_PORTS.search(b.text) for b in blocks if b.lang in RUN_LANGS
               and not b.not_run)


def run_page(page: Path, rel: str, cwd: Path, env: dict[str, str], ports: dict[int, int],
             scratch: Path) -> list[str]:
    """Run every runnable block of ``page``; returns failure messages naming page and line."""
    blocks, problems = parse(page)
    failures = [f"{rel}:{p}" for p in problems]
    runnable = [b for b in blocks if b.lang in RUN_LANGS and b.not_run is None]
    if not runnable:
        return failures
    shell = Shell(cwd, env)
    try:
        if needs_server(runnable) and not starts_server(runnable):
            watch_file(scratch / "server.log", f"{rel}: the demo server")
            ready = f"127.0.0.1:{ports[8000]}/v2/health/ready"
            out, problem = shell.run(
                f"redline serve --config {cwd_rel(cwd, env)}.redline/demo/redline.yaml "
                f">{scratch}/server.log 2>&1 &\n"
                # polled every 0.1 s (curl's --retry-delay is whole seconds: up to one per page
                # lost); the last try fails the shell (set -e) when it never got ready
                f"for _ in $(seq 600); do curl -sf -o /dev/null {ready} && break; sleep 0.1; "
                f"done\ncurl -sf -o /dev/null {ready}", 90)
            if problem:
                log = (scratch / "server.log").read_text()[-3000:]
                return failures + [f"{rel}: the demo server did not start: {problem}\n{log}"]
        for n, block in enumerate(runnable):
            text = map_ports(block.text, ports)
            if block.lang == "python":
                file = scratch / f"block_{block.line}.py"
                file.write_text(text + "\n")
                command = f"python {file}"
            else:
                file = scratch / f"block_{block.line}.sh"
                file.write_text(text + "\n")
                command = f"source {file}"
            out, problem = shell.run(command, BLOCK_TIMEOUT_S)
            check_output(out, f"{rel}:{block.line}")
            if problem:
                shown = "\n".join(f"    {line}" for line in block.text.splitlines())
                failures.append(
                    f"{rel}:{block.line}: ```{block.lang} block {n + 1} of {len(runnable)} "
                    f"{problem}\n  block:\n{shown}\n  output (last 60 lines):\n"
                    + "".join(out.splitlines(keepends=True)[-60:]))
                break  # later blocks build on this one
    finally:
        shell.close()
    return failures


def cwd_rel(cwd: Path, env: dict[str, str]) -> str:
    """The path from a page's folder back to the project root (``../../`` for examples)."""
    root = Path(env["REDLINE_DOCS_ROOT"])
    depth = len(cwd.relative_to(root).parts)
    return "../" * depth
