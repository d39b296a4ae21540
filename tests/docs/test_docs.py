"""Every ```bash and ```python block of README.md, docs/*.md and examples/*/README.md runs as
written, after a small ``make demo``, and fails here when a page drifts (see runner.py for the
rules a page follows). A failure names the page, the block's line, the block and its output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RedisServer, free_port
from tests.docs.runner import parse, run_page

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / "examples").glob("*/README.md")])
# Pages whose owners are rewriting them (issues 9, 10, 11, 13, 14) and that do not run as written
# yet. Strict: when such a page passes, this test fails until the page leaves the list, so the
# list only ever shrinks. Owner of a page: run `pytest tests/docs -k <page>` and read the message
# (page:line, the block, its output), fix the page, remove it from here.
PENDING_PAGES: set[str] = set()
# A smaller `make demo`: the same steps and files, fewer rows and calls.
DEMO_ARGS = ["--calls", "200", "--cards", "300", "--days", "4", "--replay", "200",
             "--bench-seconds", "0.5"]


def project_files() -> list[str]:
    """What a fresh clone has: tracked files and new files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if (ROOT / line).is_file()]


@pytest.fixture(scope="session")
def demo_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project in which the small demo has run (what a reader has)."""
    base = tmp_path_factory.mktemp("docs") / "base"
    for rel in project_files():
        target = base / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    venv = Path(sys.prefix)
    (base / ".venv").symlink_to(venv, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(base / "src")}
    env.pop("REDLINE_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "redline.demo", *DEMO_ARGS], cwd=base, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the demo failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return base


@pytest.fixture(scope="session")
def docs_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run `make services` (tools/services.d)")
    server = RedisServer(tmp_path_factory.mktemp("docs-redis")).start()
    yield server
    server.kill()


@pytest.mark.slow
@pytest.mark.timeout(900)
def page_params() -> list[object]:
    out: list[object] = []
    for page in PAGES:
        rel = str(page.relative_to(ROOT))
        marks = [pytest.mark.xfail(strict=True, reason=f"{rel} does not run as written yet; "
                                   "when it does, remove it from PENDING_PAGES in "
                                   "tests/docs/test_docs.py")] if rel in PENDING_PAGES else []
        out.append(pytest.param(page, id=rel, marks=marks))
    return out


@pytest.mark.parametrize("page", page_params())
def test_page_runs_as_written(page: Path, demo_project: Path, docs_redis: RedisServer,
                              tmp_path: Path) -> None:
    rel = str(page.relative_to(ROOT))
    blocks, problems = parse(page)
    if not problems and not any(b.lang in ("bash", "python") and b.not_run is None
                                for b in blocks):
        return  # nothing to run (and nothing wrong with its markup)
    copy = tmp_path / "project"
    shutil.copytree(demo_project, copy, symlinks=True)
    cwd = copy / page.relative_to(ROOT).parent
    if page.name != "README.md" or page.parent == ROOT:
        cwd = copy  # README.md and docs/*.md start at the project root
    ports = {8000: free_port(), 8001: free_port(), 8010: free_port(), 6379: docs_redis.port}
    venv_bin = str(copy / ".venv" / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDLINE_")}
    env.update({
        "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
        "VIRTUAL_ENV": str(copy / ".venv"),
        "PYTHONPATH": str(copy / "src"),
        "REDLINE_DOCS_ROOT": str(copy),
        "REDLINE_SERVER__HTTP_PORT": str(ports[8000]),
        "REDLINE_SERVER__GRPC_PORT": str(ports[8001]),
        "REDLINE_FEATURES__HTTP_PORT": str(ports[8010]),
        "REDLINE_FEATURES__REDIS_URL": f"redis://127.0.0.1:{docs_redis.port}/0",
    })
    scratch = tmp_path / "blocks"
    scratch.mkdir()
    failures = run_page(page, rel, cwd, env, ports, scratch)
    assert not failures, "\n\n".join(failures)
