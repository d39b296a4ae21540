"""``redline init``: the scaffold serves at once, and its training script adds a model that the
running server picks up and answers ``/v1`` predictions with."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from redline.cli import main
from tests.conftest import free_port
from tests.logwatch import LoggedPopen

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def wait_ready(url: str, proc: LoggedPopen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"redline serve exited: {proc.log_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail("redline serve did not become ready")


@pytest.mark.timeout(180)
def test_init_serves_at_once_then_trains_and_predicts(tmp_path: Path, capsys) -> None:
    project = tmp_path / "shop"
    main(["init", str(project), "--users", "30"])
    assert "created a redline project" in capsys.readouterr().out
    for name in ("redline.yaml", "features.py", "train.py", "README.md", "data/events.jsonl",
                 "data/labels.jsonl"):
        assert (project / name).is_file(), name
    http = free_port()
    env = {**os.environ, "REDLINE_SERVER__HTTP_PORT": str(http)}
    env.pop("REDLINE_CONFIG", None)
    # `redline serve` in the new folder, with nothing else: the scaffold's redline.yaml is used
    proc = LoggedPopen([sys.executable, "-m", "redline.cli", "serve", "--no-grpc"],
                       source="redline serve", log=tmp_path / "serve.log", cwd=project, env=env)
    url = f"http://127.0.0.1:{http}"
    try:
        wait_ready(url, proc)
        done = subprocess.run([sys.executable, "train.py"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "registered purchases version 1" in done.stdout
        body = {"entities": {"user_id": "u1"}, "request": {"amount": 250.0}}
        deadline = time.monotonic() + 30
        while True:  # the watcher loads the new model within a second or so
            r = httpx.post(f"{url}/v1/models/purchases/predict", json=body, timeout=5)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["entity_missing"] is False  # the preloaded events are in the store
        assert 0.0 <= doc["prediction"] <= 1.0 and doc["model_version"] == "1"
    finally:
        proc.terminate()
        proc.wait(30)
    # every start-up phase is logged with its time, the preload with its rate
    log = proc.log_text()
    phases = [line.split("start-up: ", 1)[1] for line in log.splitlines() if "start-up: " in line]
    names = [p.split(" in ")[0] for p in phases]
    assert names[0] == "imports and settings" and names[-1].startswith("ready"), phases
    for name in ("preload", "models loaded and warm", "request path warm", "listening"):
        assert name in names, phases
    preload = next(p for p in phases if p.startswith("preload in "))
    assert "events/s" in preload and "0 dead letters" in preload


def test_init_refuses_an_existing_project(tmp_path: Path, capsys) -> None:
    (tmp_path / "redline.yaml").write_text("{}\n")
    with pytest.raises(SystemExit) as exc:
        main(["init", str(tmp_path)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("error [invalid_input]: ")


def test_init_never_overwrites_a_file_and_lists_what_exists(tmp_path: Path, capsys,
                                                             monkeypatch) -> None:
    # a clone of redline: its own README and the demo's project folder
    (tmp_path / "README.md").write_text("the repository's own readme\n")
    (tmp_path / ".redline" / "models").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["init"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "README.md" in err and ".redline" in err and "--force" in err
    assert (tmp_path / "README.md").read_text() == "the repository's own readme\n"
    assert not (tmp_path / "redline.yaml").exists()  # nothing written at all


def test_init_force_overwrites_the_scaffold_files_only(tmp_path: Path, capsys) -> None:
    (tmp_path / "README.md").write_text("old\n")
    (tmp_path / "notes.txt").write_text("mine\n")
    main(["init", str(tmp_path), "--force", "--users", "3"])
    assert "A redline project made by `redline init`" in (tmp_path / "README.md").read_text()
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    assert (tmp_path / "redline.yaml").is_file()
