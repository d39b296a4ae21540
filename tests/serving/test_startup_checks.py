"""What ``redline serve`` refuses before it serves, each in one line (exit 2) that says what was
wrong and what to do: a gRPC port another server (a pool of workers included) listens on, a port
out of range from any source, a model repository that is not there. An empty repository starts,
with a warning."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from redline.cli import main
from redline.models import ModelRepository
from tests.conftest import free_port
from tests.logwatch import LoggedPopen
from tests.serving.helpers import affine_model

SERVE = [sys.executable, "-m", "redline.cli", "serve"]


def wait_ready(proc: LoggedPopen, url: str) -> None:
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, f"redline serve exited: {proc.log_text()[-3000:]}"
        assert time.monotonic() < deadline, f"never ready: {proc.log_text()[-3000:]}"
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def stop(proc: LoggedPopen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def serve_briefly(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """``redline serve`` that is expected to refuse; one that starts instead is stopped (after
    the time a refusal takes) and reported as exit code 0."""
    proc = subprocess.Popen([*SERVE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})
    try:
        out, err = proc.communicate(timeout=30)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        return 0, f"still serving after 30 s; its output: {err[-2000:]}"


@pytest.mark.slow
def test_a_grpc_port_that_a_pool_serves_is_refused(tmp_path: Path) -> None:
    """Workers bind gRPC with SO_REUSEPORT; a second pool (or a single server) on the same gRPC
    port must not join the first one's listener and take a share of its calls."""
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    grpc_port, http = free_port(), free_port()
    first = LoggedPopen([*SERVE, "-r", str(tmp_path / "repo"), "--no-watch", "--workers", "2",
                         "--http-port", str(http), "--grpc-port", str(grpc_port)],
                        source="first pool", log=tmp_path / "first.log")
    try:
        wait_ready(first, f"http://127.0.0.1:{http}")
        (tmp_path / "empty").mkdir()  # its warning must not come before the refusal
        for workers in ("2", "1"):  # a second pool, and a server of one process
            code, err = serve_briefly(["-r", str(tmp_path / "empty"), "--no-watch", "--workers",
                                       workers, "--http-port", str(free_port()),
                                       "--grpc-port", str(grpc_port)])
            assert code == 2, (workers, err)
            lines = err.splitlines()
            assert len(lines) == 1, (workers, err)
            assert lines[0].startswith(
                f"error [config_invalid]: cannot listen for gRPC on 127.0.0.1:{grpc_port}"), err
            assert "--grpc-port" in lines[0]
        assert first.poll() is None  # the first pool serves on
    finally:
        stop(first)


def run(capsys: pytest.CaptureFixture[str], *args: str,
        env: dict[str, str] | None = None) -> tuple[int, str]:
    """The CLI in this process: its exit code and stderr."""
    old = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("source", "value"), [
    ("yaml", "70000"), ("yaml", "-1"), ("env", "70000"), ("env", "-1"),
    ("option", "70000"), ("option", "-1"),
])
@pytest.mark.parametrize("port", ["http", "grpc"])
def test_a_port_out_of_range_is_one_line(capsys, tmp_path, monkeypatch, source, value,
                                         port) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REDLINE_CONFIG", raising=False)
    (tmp_path / "models").mkdir()
    args = ["serve", "-r", "models", "--no-watch", "--workers", "2"]  # the pool binds first
    env: dict[str, str] = {}
    if source == "yaml":
        (tmp_path / "redline.yaml").write_text(f"server:\n  {port}_port: {value}\n")
        args += ["--config", "redline.yaml"]
    elif source == "env":
        env[f"REDLINE_SERVER__{port.upper()}_PORT"] = value
    else:
        args += [f"--{port}-port", value]
    code, err = run(capsys, *args, env=env)
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and value in err
    if source == "option":
        assert f"--{port}-port" in err and "0<=x<=65535" in err
    else:
        assert f"'server.{port}_port' must be between 0 and 65535" in err
        assert ("redline.yaml:2:" if source == "yaml" else "REDLINE_SERVER__") in err


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_repository_that_is_not_there_is_refused(tmp_path: Path, workers: str) -> None:
    """From the option, and from the settings (a file where the folder should be)."""
    (tmp_path / "a-file").write_text("")
    for path, how in ((tmp_path / "nonexistent" / "models", "option"),
                      (tmp_path / "a-file", "env")):
        named = ["--repository", str(path)] if how == "option" else []
        code, err = serve_briefly([*named, "--http-port", "0", "--grpc-port", "0",
                                   "--workers", workers],
                                  env={"REDLINE_REPOSITORY": str(path)} if how == "env" else None)
        assert code == 2, err
        assert err.startswith(f"error [config_invalid]: model repository {path} "), err
        assert len(err.splitlines()) == 1 and "--repository" in err


@pytest.mark.slow
def test_an_empty_repository_starts_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    http = free_port()
    proc = LoggedPopen([*SERVE, "-r", str(tmp_path / "models"), "--http-port", str(http),
                        "--no-grpc", "--workers", "1"],
                       source="redline serve", log=tmp_path / "serve.log")
    try:
        wait_ready(proc, f"http://127.0.0.1:{http}")
        log = proc.log_text()
        assert f"WARNING model repository {tmp_path / 'models'} has no model yet" in log, log
        assert "a model added there is served within seconds" in log
    finally:
        stop(proc)
