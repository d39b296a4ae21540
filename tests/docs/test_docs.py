"""Every ```bash and ```python block of README.md, docs/*.md and examples/*/README.md runs as
written, after a small ``make demo``, and fails here when a page drifts (see runner.py for the
rules a page follows). A failure names the page, the block's line, the block and its output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import RedisServer, SmallDemo, free_port
from tests.docs.runner import Block, key_paths, parse, run_page
from tests.logwatch import log_to

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / "examples").glob("*/README.md")])
# Pages whose owners are rewriting them (issues 9, 10, 11, 13, 14) and that do not run as written
# yet. Strict: when such a page passes, this test fails until the page leaves the list, so the
# list only ever shrinks. Owner of a page: run `pytest tests/docs -k <page>` and read the message
# (page:line, the block, its output), fix the page, remove it from here.
PENDING_PAGES: set[str] = set()
# Pages with nothing to run: reference tables (a benchmark or a generator writes them) and concept
# pages whose snippets are illustrations (their runnable twin is a walk-through page). Any other
# page without a runnable block fails, so a page whose blocks lost their language tag is caught.
REFERENCE_PAGES = {"docs/features.md", "docs/performance.md", "docs/settings.md"}


@pytest.fixture(scope="session")
def demo_project(small_demo: SmallDemo) -> Path:
    """A copy of the project in which the small demo has run (what a reader has)."""
    return small_demo.project


@pytest.fixture(scope="module")
def docs_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run `make services` (tools/services.d)")
    server = RedisServer(tmp_path_factory.mktemp("docs-redis")).start()
    yield server
    server.kill()


def page_params() -> list[object]:
    out: list[object] = []
    for page in PAGES:
        rel = str(page.relative_to(ROOT))
        # the first page also waits for the small demo (the session's fixture)
        marks = [pytest.mark.timeout(900), pytest.mark.xdist_group(f"page:{rel}")]
        marks += [pytest.mark.xfail(strict=True, reason=f"{rel} does not run as written yet; "
                                   "when it does, remove it from PENDING_PAGES in "
                                   "tests/docs/test_docs.py")] if rel in PENDING_PAGES else []
        out.append(pytest.param(page, id=rel, marks=marks))
    return out


@pytest.mark.parametrize("page", page_params())
def test_page_runs_as_written(page: Path, demo_project: Path, docs_redis: RedisServer,
                              tmp_path: Path) -> None:
    rel = str(page.relative_to(ROOT))
    blocks, problems = parse(page)
    runnable = any(b.lang in ("bash", "python") and b.not_run is None for b in blocks)
    if rel in REFERENCE_PAGES:
        assert not runnable, (f"{rel} now has runnable blocks: remove it from REFERENCE_PAGES in "
                              "tests/docs/test_docs.py so they run")
        assert not problems, f"{rel}: {problems}"
        return
    assert runnable or problems, (
        f"{rel} has no ```bash or ```python block to run: give the page a runnable example, or "
        "add it to REFERENCE_PAGES in tests/docs/test_docs.py if it is reference only")
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


def shown_answers() -> list[object]:
    out: list[object] = []
    for page in PAGES:
        rel = str(page.relative_to(ROOT))
        for block in parse(page)[0]:
            if block.answer_of is not None:
                out.append(pytest.param(rel, block, id=f"{rel}:{block.line}"))
    return out


@pytest.fixture(scope="module")
def demo_server(demo_project: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo's server as the README starts it, on a free port."""
    copy = tmp_path_factory.mktemp("answers") / "project"
    shutil.copytree(demo_project, copy, symlinks=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDLINE_")}
    env.update({"PYTHONPATH": str(copy / "src"), "REDLINE_SERVER__HTTP_PORT": str(port)})
    log = log_to(copy / "server.log", "the demo server")
    proc = subprocess.Popen([sys.executable, "-m", "redline.cli", "serve", "--no-grpc",
                             "--config", ".redline/demo/redline.yaml"], cwd=copy, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (copy / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the demo server did not become ready"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.mark.parametrize(("rel", "block"), shown_answers())
def test_a_shown_answer_has_the_real_answers_keys(rel: str, block: Block, demo_server: str,
                                                 demo_project: Path) -> None:
    assert block.answer_of is not None
    method, path, body_file = block.answer_of
    body = (demo_project / body_file).read_bytes() if body_file else None
    try:
        shown = key_paths(orjson.loads(block.text))
    except orjson.JSONDecodeError as exc:
        pytest.fail(f"{rel}:{block.line}: the shown answer is not one JSON document: {exc}")
    # A few answers: a key that only some carry (a stage a request may skip, such as a queue
    # wait) may be shown or not; a key every answer carries must be shown, and nothing else.
    answers = []
    for _ in range(3):
        real = httpx.request(method, demo_server + path, content=body, timeout=30)
        assert real.status_code == 200, f"{rel}:{block.line}: {method} {path}: {real.text}"
        answers.append(key_paths(real.json()))
    always, sometimes = set.intersection(*answers), set.union(*answers)
    missing, extra = always - shown, shown - sometimes
    assert not missing and not extra, (
        f"{rel}:{block.line}: the answer shown for {method} {path} differs from the real one: "
        f"shown but never answered {sorted(extra)}, always answered but not shown "
        f"{sorted(missing)}; a real answer: {real.text}")
