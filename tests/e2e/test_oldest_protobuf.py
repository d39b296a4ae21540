"""redline on the oldest protobuf and grpcio that pyproject.toml allows, with tritonclient in the
same environment: the server starts, and tritonclient's gRPC client gets a right answer.

The generated modules in ``redline/proto`` must load on every protobuf the range allows; code
from a newer protoc refuses any older runtime (a ``VersionError`` at import, so no server). The
environment is a venv of redline's own dependencies with protobuf and grpcio at their lower
bounds; it is built once per set of requirements (about a minute) and kept in the user's cache
folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from redline.models import ModelRepository
from tests.conftest import free_port
from tests.logwatch import LoggedPopen
from tests.serving.helpers import affine_model

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
AT_FLOOR = ("protobuf", "grpcio")
# tritonclient 2.46 and later ship gRPC code generated for grpcio 1.64 or newer (a warning below
# it, from 2.49 an error): 2.45 is the newest that runs on grpcio 1.62 as it is.
TRITONCLIENT = "tritonclient[grpc]<2.46"

CLIENT = """
import json, sys, warnings
warnings.simplefilter("error")  # a gencode/runtime mismatch warning fails too
import google.protobuf, grpc, numpy as np
import tritonclient.grpc as tg
from redline.proto import grpc_service_pb2, redline_v1_pb2  # beside tritonclient's own
client = tg.InferenceServerClient(sys.argv[1])
x = np.arange(8, dtype=np.float32).reshape(2, 4)
tensor = tg.InferInput("x", [2, 4], "FP32")
tensor.set_data_from_numpy(x)
result = client.infer("affine", [tensor], outputs=[tg.InferRequestedOutput("y")])
print(json.dumps({"protobuf": google.protobuf.__version__, "grpcio": grpc.__version__,
                  "server": client.get_server_metadata().name,
                  "y": result.as_numpy("y").tolist()}))
"""


def floors() -> dict[str, str]:
    """The lower bound pyproject.toml declares for each of ``AT_FLOOR``."""
    found = {}
    for line in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]:
        req = Requirement(line)
        if req.name in AT_FLOOR:
            lows = [s.version for s in req.specifier if s.operator == ">="]
            assert lows, f"{line}: no lower bound (>=) to test"
            found[req.name] = lows[0]
    assert set(found) == set(AT_FLOOR), f"pyproject.toml does not list {AT_FLOOR}"
    return found


def requirements() -> list[str]:
    """redline's dependencies, protobuf and grpcio pinned to their floors, and tritonclient."""
    pins = floors()
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return [f"{Requirement(d).name}=={pins[Requirement(d).name]}"
            if Requirement(d).name in pins else d for d in deps] + [TRITONCLIENT]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "redline-test-venvs"


def oldest_venv() -> Path:
    """The venv for these requirements on this Python: built under a lock (one builder at a
    time, the others wait and reuse it), marked complete only when pip succeeded. Keyed on what
    goes into it (the requirements and the interpreter), not on the whole pyproject.toml, so an
    edit elsewhere in it (a dev extra, a tool's settings) does not rebuild it. Each use touches
    the mark; venvs of other requirements unused for a day are removed (another checkout may be
    using one right now)."""
    reqs = requirements()
    key = hashlib.sha256(("\n".join(reqs) + "\n" + sys.version).encode()).hexdigest()[:16]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"oldest-protobuf-{key}"
    with (root / "oldest-protobuf.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / "complete").exists():
            (venv / "complete").touch()
            return venv
        for old in root.glob("oldest-protobuf-*"):
            mark = old / "complete"
            used = mark.stat().st_mtime if mark.exists() else old.stat().st_mtime
            if old != venv and time.time() - used > 86400:
                shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(venv, ignore_errors=True)  # a build that did not finish
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        # --no-compile: the server imports a small part of what pip would compile (a third
        # of the build's CPU in a fresh clone, where the venv is always built)
        pip = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
             "--disable-pip-version-check", *reqs],
            capture_output=True, text=True, timeout=600)
        if pip.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.fail(f"pip cannot install {reqs}:\n{pip.stderr[-3000:]}")
        (venv / "complete").write_text("\n".join(reqs) + "\n")
    return venv


def test_generated_code_names_no_runtime_version() -> None:
    """The cheap half: code from protoc 26+ and grpcio-tools 1.64+ checks the runtime's version
    at import and refuses older ones; `make proto` generates code without those checks."""
    for path in sorted((ROOT / "src" / "redline" / "proto").glob("*_pb2*.py")):
        text = path.read_text()
        for check in ("ValidateProtobufRuntimeVersion", "GRPC_GENERATED_VERSION"):
            assert check not in text, f"{path.name} pins its runtime ({check}): run `make proto`"


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first run builds the venv
def test_server_on_the_oldest_protobuf_answers_tritonclient(tmp_path: Path) -> None:
    python = str(oldest_venv() / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(ROOT / "src")  # this tree's redline on the venv's dependencies
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    config = tmp_path / "redline.yaml"
    config.write_text("runtime:\n  warmup_batch_sizes: [1]\n  warmup_runs: 1\n")
    http, grpc_port = free_port(), free_port()
    proc = LoggedPopen(
        [python, "-m", "redline.cli", "serve", "--config", str(config), "--repository",
         str(tmp_path / "repo"), "--http-port", str(http), "--grpc-port", str(grpc_port),
         "--no-watch", "--workers", "1"],
        source="redline serve (oldest protobuf)", log=tmp_path / "serve.log", env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{http}/v2/health/ready",
                             timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redline serve did not become ready: {proc.log_text()[-3000:]}")
            time.sleep(0.2)
        done = subprocess.run([python, "-c", CLIENT, f"127.0.0.1:{grpc_port}"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        answer = json.loads(done.stdout)
    finally:
        proc.kill()
        proc.wait(10)
    for name, floor in floors().items():  # the server's environment really is the oldest
        assert Version(answer[name]) == Version(floor), (name, answer[name], floor)
    assert answer["server"] == "redline"
    assert answer["y"] == [[0.0, 2.0, 4.0, 6.0], [8.0, 10.0, 12.0, 14.0]]
