"""Benchmarks anyone can rerun from a clone: every peer set up from the repository, every peer
process stopped, prose written from the table beside it, runs that never share results."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import run_all
from benchmarks.peers import envs, procs
from benchmarks.peers.feast.store import runtime_copy

ROOT = Path(__file__).resolve().parents[2]
# Setups that lived outside the repository; written in pieces so this file does not name them.
OUTSIDE = ("shared" + "/peers", "peer" + " kit", "peers" + " kit", "--kit" + "-venv",
           "REDLINE_PEER" + "_KIT")


def test_no_file_names_a_peer_setup_outside_the_repository() -> None:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "benchmarks", "docs", "tests", "src", "examples", "README.md",
                             "Makefile"], cwd=ROOT, capture_output=True, text=True, check=True)
    found = []
    for name in listed.stdout.split():
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [f"{name}: {needle}" for needle in OUTSIDE if needle in text]
    assert not found, f"set-ups named outside the repository (use benchmarks/peers/): {found}"


def test_each_peer_setup_the_page_names_is_in_the_repository() -> None:
    for peer in ("floors", "mlserver", "feast", "ray-serve"):
        assert peer in envs.PEERS
    for path in ("benchmarks/peers/setup.sh", "benchmarks/peers/feast/app.py",
                 "benchmarks/peers/feast/prepare.py", "benchmarks/peers/mlserver/model.py",
                 "benchmarks/serving/floors/nginx.conf", "benchmarks/recommend/ray_serve_app.py"):
        assert (ROOT / path).is_file(), path


def test_a_peer_environment_lives_in_the_cache_folder_and_counts_once_ready(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REDLINE_PEERS_HOME", str(tmp_path))
    folder = envs.env_dir("feast")
    assert folder.parent == tmp_path and folder.name.startswith("feast-")
    assert envs.find("feast") is None  # nothing made yet
    (folder / "bin").mkdir(parents=True)
    assert envs.find("feast") is None  # half made: no .ready
    (folder / ".ready").touch()
    assert envs.find("feast") == folder / "bin" / "python"
    assert envs.data_dir("feast") == folder / "data"


def test_a_run_serves_its_own_copy_of_the_feast_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match="benchmarks/peers/setup.sh feast"):
        runtime_copy(data, tmp_path / "run", 7000)
    (data / "repo" / "data").mkdir(parents=True)
    (data / "repo" / "feature_store.yaml").write_text(
        'online_store:\n  type: redis\n  connection_string: "127.0.0.1:6390"\n')
    (data / "repo" / "data" / "registry.db").write_bytes(b"registry")
    (data / "dump.rdb").write_bytes(b"snapshot")
    (data / "peer.json").write_text('{"cards": 100}')
    repo = runtime_copy(data, tmp_path / "run", 7000)
    assert '"127.0.0.1:7000"' in (repo / "feature_store.yaml").read_text()
    assert (tmp_path / "run" / "dump.rdb").read_bytes() == b"snapshot"
    assert '"127.0.0.1:6390"' in (data / "repo" / "feature_store.yaml").read_text()  # untouched


@pytest.mark.slow
def test_every_process_a_peer_started_is_stopped_even_one_that_left_its_group() -> None:
    tag = procs.new_tag()
    # A server that starts a helper in a session of its own (as Ray starts HAProxy and its
    # workers): killing the server's process group would leave the helper holding its ports.
    server = subprocess.Popen(["bash", "-c", "setsid sleep 300 & sleep 300"],
                              env=procs.tagged_env(tag), start_new_session=True)
    bystander = subprocess.Popen(["sleep", "300"])  # not tagged: never touched
    try:
        deadline = time.monotonic() + 10
        while len(procs.tagged(tag)) < 3 and time.monotonic() < deadline:  # bash, 2 sleeps
            time.sleep(0.05)
        assert len(procs.tagged(tag)) == 3
        procs.stop_tagged(tag, grace_s=5)
        server.wait(5)
        assert procs.tagged(tag) == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)


def test_a_ray_peer_configuration_names_layout_ingress_and_batch() -> None:
    from benchmarks.recommend.compare_ray_serve import parse_peer

    assert parse_peer("one:proxy") == ("one", "proxy", 0)
    assert parse_peer("three:haproxy:8") == ("three", "haproxy", 8)
    for bad in ("one:1:8", "two:proxy", "three:haproxy:x"):
        with pytest.raises(ValueError, match="LAYOUT:INGRESS"):
            parse_peer(bad)
    # make bench runs both of Ray's modes, each with and without batching, and a replica per
    # redline worker
    plan = run_all._ray_plan(_args())
    assert {"one:proxy", "one:proxy:8", "one:haproxy", "one:haproxy:8"} <= set(plan)
    assert plan[plan.index("--workers") + 1] == str(os.cpu_count() or 1)


def _args() -> object:
    import argparse

    return argparse.Namespace(machine="test machine", feast_python=None, rounds=3,
                              ray_python=None, install_peers=False, wanted=[])


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _lead_and_rows(body: str) -> tuple[str, dict[str, list[str]]]:
    lead = next(line for line in body.splitlines() if line.startswith("Against Ray Serve"))
    rows = {_cells(line)[0]: _cells(line) for line in body.splitlines()
            if line.startswith("| ray-serve ") or line.startswith("| redline (in turns with ")}
    return lead, rows


def _lead_matches_rows(lead: str, rows: dict[str, list[str]], bound: float) -> None:
    config = re.search(r"best configuration in this run \(([^)]+)\)", lead)
    assert config, lead
    best = config.group(1)
    peer, ours = rows[f"ray-serve {best}"], rows[f"redline (in turns with {best})"]
    assert lead == run_all.ray_lead(best, peer, ours, bound)
    for i, where in ((1, "at c=1"), (3, "at c=8")):
        ratio = float(ours[i]) / float(peer[i])
        assert f"{ratio:.1f}x {'its throughput ' if i == 1 else ''}{where}" in lead


def test_the_sentence_beside_the_ray_table_is_written_from_its_rows() -> None:
    def side(c1: float, c8: float, top: int | None) -> dict:  # type: ignore[type-arg]
        out: dict = {"c1": {"rps": c1, "p50_ms": 2.0, "p99_ms": 5.0},  # type: ignore[type-arg]
                     "c8": {"rps": c8, "p50_ms": 8.0, "p99_ms": 30.0},
                     "ladder": [{"rate": 5, "p50_ms": 3.0, "p99_ms": 25.0, "errors": 0}]}
        if top:
            out["max_rate_p99_ok"] = top
        return out

    peers = {"one:proxy": {"ray-serve one:proxy": side(119.4, 178.3, 80),
                           "redline": side(524.2, 830.4, 600)},
             "three:haproxy:8": {"ray-serve three:haproxy:8": side(56.0, 86.0, None),
                                 "redline": side(508.0, 1170.0, 600)}}
    from benchmarks.recommend.compare_ray_serve import summarize

    report = {"p99_bound_ms": 20.0, "peers": peers, "summary": summarize(peers)}
    args = _args()
    body = run_all._ray(args, run_all._ray_plan(args), [report]).body  # type: ignore[arg-type]
    lead, rows = _lead_and_rows(body)
    _lead_matches_rows(lead, rows, 20.0)
    assert "(one:proxy)" in lead
    assert "7.5x its highest rate with p99 ≤ 20 ms (600 against 80 req/s)" in lead
    assert "4.4x its throughput at c=1 and 4.7x at c=8" in lead
    # both of Ray's modes are named, and which one the targets are measured against
    assert ("in its default mode (Python proxy), one:proxy: 80 req/s" in body
            and "in its throughput-optimized mode (HAProxy), three:haproxy:8: no rate with "
            "p99 ≤ 20 ms" in body)
    assert "The peer's best, which the targets are measured against: one:proxy" in body
    assert "| throughput-optimized, HAProxy, @serve.batch 8 |" in body
    # the targets, each against that best configuration
    for target in ("c=8 throughput, redline over Ray Serve one:proxy >= 3.000x",
                   "highest rate with p99 ≤ 20 ms, redline over Ray Serve one:proxy >= 3.000x",
                   "c=1 p50, redline over Ray Serve one:proxy <= 1.000x",
                   "rates Ray Serve one:proxy sustained (1) where redline's p99 was not "
                   "lower <= 0.000"):
        assert f"| {target} |" in body, body


def test_the_page_says_what_its_ray_table_says() -> None:
    page = (ROOT / "docs" / "performance.md").read_text()
    block = page.split("<!-- bench:recommend-ray:start -->")[1].split(
        "<!-- bench:recommend-ray:end -->")[0]
    bound = re.search(r"highest rate with p99 ≤ (\d+) ms \|", block)
    assert bound, "the Ray Serve table's last column names its p99 bound"
    lead, rows = _lead_and_rows(block)
    _lead_matches_rows(lead, rows, float(bound.group(1)))
    # The prose before the block types no ratio of its own: the block's sentence carries them.
    before = page.split("<!-- bench:graph:end -->")[1].split("<!-- bench:recommend-ray:start")[0]
    typed = re.findall(r"\b\d+(?:\.\d+)?x\b", before)
    assert not typed, f"ratios typed by hand beside the Ray Serve table: {typed}"


def test_two_runs_at_once_keep_their_results_apart() -> None:
    code = ("import sys; sys.path.insert(0, '.'); from benchmarks import run_all; "
            "p = run_all._scratch('serving.json'); p.write_text('{}'); "
            "assert run_all._scratch('ray.json').parent == p.parent; print(p.parent)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    runs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True) for _ in range(2)]
    folders = [Path(run.communicate(timeout=60)[0].strip()) for run in runs]
    assert all(run.returncode == 0 for run in runs)
    assert folders[0] != folders[1]
    assert all(f.name.startswith(f"redline-bench-{os.getuid()}-") for f in folders)
    assert not any(f.exists() for f in folders), "a run's work folder outlived it"
