"""Canary with automatic rollback (a wrong and a slow candidate), sticky shares, and shadow."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest

from redline.cli import main
from redline.config import load_settings
from redline.models import ModelRepository
from redline.models.metadata import ModelMetadata, TensorSpec
from redline.scaling.rollout import (
    MergedStats,
    RolloutController,
    RolloutFile,
    RolloutSpec,
    VersionStats,
    aggregate_stats,
    decide_rollback,
    install,
    sticky_share,
    unservable_candidate,
)
from tests.scaling.models import failing_affine, slow_affine, write_stats_now
from tests.serving.helpers import ServerThread, affine_model

# What the failing candidate (tests/scaling/models.py) logs for each request it fails.
FAILING_CANDIDATE = (r"unhandled error on POST /v2/models/affine/infer|Gather node"
                     r"|model 'affine:2' failed to run")

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

BIG = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [5, 5, 5, 5]}]}


def cli(*args: str) -> None:
    try:
        main([*args])
    except SystemExit as done:
        assert done.code in (0, None), done


@pytest.fixture()
def project(tmp_path: Path):  # type: ignore[no-untyped-def]
    repo = ModelRepository(tmp_path / "models")
    repo.add_onnx("affine", affine_model())            # v1: the baseline
    repo.add_onnx("affine", failing_affine())          # v2: errors on real traffic
    repo.add_onnx("affine", slow_affine(layers=500))   # v3: right answers, ~15 ms late
    repo.add_onnx("affine", affine_model(scale=3.0))   # v4: fast, wrong answers
    repo.promote("affine", 1)
    config = tmp_path / "redline.yaml"
    config.write_text("project: .\nrepository: models\nruntime:\n  warmup_batch_sizes: [1]\n"
                      "  warmup_runs: 1\nbatching:\n  max_batch_size: 1\n"
                      "server:\n  watch_interval_s: 0.2\n  grpc_enabled: false\n"
                      "models:\n  affine:\n    version_policy: all\n")
    settings = load_settings(config)
    server = ServerThread(settings, repo)
    controller = install(server.server)
    server.start()
    try:
        yield server, controller, str(config), tmp_path
    finally:
        server.stop()


def post(client: httpx.Client, n: int, body: dict = BIG) -> list[tuple[int, str]]:  # type: ignore[type-arg]
    out = []
    for _ in range(n):
        r = client.post("/v2/models/affine/infer", json=body)
        out.append((r.status_code, r.json().get("model_version", "")))
    return out


def wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Poll instead of sleeping a fixed time: a loaded CI machine may be slower than a guess."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def wait_state(path: Path, model: str, state: str, timeout: float = 5.0) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = json.loads(path.read_text())["rollouts"][model]
        if doc["state"] == state:
            return doc  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise AssertionError(f"rollout not {state}: {path.read_text()}")


@pytest.mark.allow_log(FAILING_CANDIDATE)
def test_canary_rolls_back_a_failing_candidate(project, capsys) -> None:  # type: ignore[no-untyped-def]
    server, controller, config, root = project
    observers = server.server.observers
    # No rollout: the controller sees no request, and the monitor alone gets the common
    # requests' flat stage times instead of a record each.
    assert controller not in observers and observers.stage_times is not None
    cli("rollout", "start", "--config", config, "-m", "affine", "--candidate", "2",
        "--percent", "30", "--min-requests", "20")
    controller.refresh(force=True)  # what the server's poll of the rollout file does, now
    with httpx.Client(base_url=server.http, timeout=10) as client:
        first = post(client, 1)
        assert controller in observers and observers.stage_times is None  # every record
        first += post(client, 299)
        served_by = {v for code, v in first if code == 200}
        failed = [c for c, _ in first if c != 200]
        assert "1" in served_by and failed  # the candidate got real traffic, and failed it
        doc = wait_state(root / "rollout.json", "affine", "rolled_back")
        assert "error rate" in doc["reason"]
        # Decided over enough requests to tell, and well before 300: the damage is bounded.
        assert 20 <= len(failed) < 120
        after = post(client, 50)
    assert after == [(200, "1")] * 50
    assert controller not in observers and observers.stage_times is not None  # rolled back
    cli("rollout", "status", "--config", config, "-m", "affine", "--json")
    status = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert status["rollouts"]["affine"]["state"] == "rolled_back"


def test_canary_rolls_back_a_slow_candidate_and_promote_works(project, capsys) -> None:  # type: ignore[no-untyped-def]
    server, controller, config, root = project
    small = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                         "data": [0.1, 0.2, 0.3, 0.4]}]}
    cli("rollout", "start", "--config", config, "-m", "affine", "--candidate", "3",
        "--percent", "50", "--min-requests", "30", "--max-p99-ratio", "2")
    controller.refresh(force=True)
    with httpx.Client(base_url=server.http, timeout=10) as client:
        results = post(client, 200, small)
        assert all(code == 200 for code, _ in results)  # slow, not wrong: every answer is fine
        doc = wait_state(root / "rollout.json", "affine", "rolled_back")
        assert "p99" in doc["reason"]
        assert post(client, 20, small) == [(200, "1")] * 20
    # A healthy candidate is promoted by hand: production moves, the rollout ends.
    cli("rollout", "start", "--config", config, "-m", "affine", "--candidate", "4",
        "--percent", "10")
    cli("rollout", "promote", "--config", config, "-m", "affine")
    repo = ModelRepository(root / "models")
    assert repo.resolve("affine", None) == 4
    capsys.readouterr()


def test_shadow_never_changes_or_delays_an_answer(project, capsys) -> None:  # type: ignore[no-untyped-def]
    server, controller, config, root = project
    small = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                         "data": [0.1, 0.2, 0.3, 0.4]}]}
    # A wrong candidate in shadow: every answer is still the baseline's; mismatches reported.
    cli("rollout", "start", "--config", config, "-m", "affine", "--candidate", "4",
        "--shadow", "--percent", "100")
    controller.refresh(force=True)
    with httpx.Client(base_url=server.http, timeout=10) as client:
        for _ in range(100):
            r = client.post("/v2/models/affine/infer", json=small)
            assert r.status_code == 200 and r.json()["model_version"] == "1"
            assert np.allclose(r.json()["outputs"][0]["data"], [0.2, 0.4, 0.6, 0.8])
        wait_for(lambda: getattr(controller.shadow.get("affine"), "compared", 0) >= 50)
        shadow = controller.shadow["affine"]
        assert shadow.compared >= 50 and shadow.mismatched == shadow.compared
        assert shadow.max_abs_diff == pytest.approx(0.4, rel=1e-3)
        baseline = server.server.registry.get("affine", "1")
        assert baseline.shadowed  # a shadowed baseline keeps every request's arrays for replay
        cli("rollout", "abort", "--config", config, "-m", "affine")
        controller.refresh(force=True)
        assert not baseline.shadowed  # ...and stops once the shadow ends
        # ...while monitoring keeps its own sample of the version's requests.
        assert baseline.keep_io == server.server.settings.monitoring.enabled
        # A slow candidate in shadow: answers come back at the baseline's speed, not its.
        cli("rollout", "start", "--config", config, "-m", "affine", "--candidate", "3",
            "--shadow", "--percent", "100")
        controller.refresh(force=True)
        waited = []
        for _ in range(60):
            t0 = time.perf_counter()
            r = client.post("/v2/models/affine/infer", json=small)
            waited.append(time.perf_counter() - t0)
            assert r.json()["model_version"] == "1"
            time.sleep(0.005)
        wait_for(lambda: getattr(controller.shadow.get("affine"), "compared", 0) >= 5)
    slow = controller.shadow["affine"]
    assert slow.compared >= 5 and slow.mismatched == 0  # same answers, just slower
    assert slow.sent + slow.dropped >= 50  # copies beyond 4 in flight are dropped, not queued
    candidate_p50_ms = float(np.median(slow.candidate._lat_us[-slow.candidate.requests:])) / 1e3
    assert np.median(waited) * 1e3 < candidate_p50_ms / 2, (np.median(waited), candidate_p50_ms)
    write_stats_now(controller)  # writes this process's counts for `rollout status`
    stats = aggregate_stats(controller.file)
    assert stats["processes"] == 1 and stats["shadow"]["affine"]["compared"] >= 5
    capsys.readouterr()


def test_decisions_and_sticky_shares() -> None:
    spec = RolloutSpec(model="m", baseline=1, candidate=2, min_requests=100)
    base, cand = VersionStats(), VersionStats()
    for _ in range(99):
        base.add(True, 1000)
        cand.add(False, 1000)
    assert decide_rollback(spec, base, cand) is None  # not enough requests to tell
    base.add(True, 1000)
    cand.add(False, 1000)
    assert "error rate" in (decide_rollback(spec, base, cand) or "")
    fast, same = VersionStats(), VersionStats()
    for i in range(200):
        fast.add(True, 1000 + i)
        same.add(True, 1100 + i)
    assert decide_rollback(spec, fast, same) is None  # 0.1 ms worse is noise, not a regression
    keys = [{"card_id": f"c{i}"} for i in range(2000)]
    shares = [sticky_share([k]) for k in keys]
    assert shares == [sticky_share([k]) for k in keys]  # stable: an entity keeps its version
    assert 0.07 < sum(s < 10 for s in shares) / len(shares) < 0.13


class _Record:
    def __init__(self, version: int, ok: bool, total_us: float) -> None:
        self.model, self.version = "m", str(version)
        self.status = "ok" if ok else "internal"
        self.total_us = total_us
        self.inputs = self.outputs = None  # none kept (a RequestRecord's, when not sampled)


def test_the_decision_sums_every_process(tmp_path: Path) -> None:
    """Two processes (two controllers with their own stats files) see 60 failing candidate
    requests each: neither alone reaches min_requests=100, their sum does - the second one to
    cross decides, and the rollback it writes is what both follow."""
    file = RolloutFile(tmp_path / "rollout.json")
    file.write({"m": RolloutSpec(model="m", baseline=1, candidate=2, min_requests=100)})
    a = RolloutController(None, file.path, instance="a")
    b = RolloutController(None, file.path, instance="b")
    RolloutFile(tmp_path / "other.json").write(
        {"m": RolloutSpec(model="m", baseline=1, candidate=2, min_requests=100)})
    alone = RolloutController(None, tmp_path / "other.json", instance="c")
    for ctl in (a, alone):
        for _ in range(80):
            ctl.request_finished(_Record(1, True, 1000))
        for _ in range(60):
            ctl.request_finished(_Record(2, False, 1000))
    assert "m" in a.active and "m" in alone.active  # 60 < 100: too few to tell, per process
    a._write_stats()
    for _ in range(80):
        b.request_finished(_Record(1, True, 1000))
    for _ in range(30):
        b.request_finished(_Record(2, False, 1000))
    assert "m" in b.active  # 30 + 60 = 90 candidate requests: not yet...
    assert b.merged("m", 2).requests == 90 and b.merged("m", 2).processes == 2
    for _ in range(10):
        b.request_finished(_Record(2, False, 1000))
    assert "m" not in b.active  # ...100: rolled back, on the sum
    doc = file.read()["m"]
    assert doc.state == "rolled_back" and "over 100 requests" in doc.reason
    a.refresh(force=True)
    assert "m" not in a.active  # the other process follows the file
    # A file from an earlier rollout of the same model is not counted in a new one.
    file.write({"m": RolloutSpec(model="m", baseline=1, candidate=2, min_requests=100)})
    b.refresh(force=True)
    b._peers_read = float("-inf")
    assert b.merged("m", 2).requests == 0


def test_merged_p99_is_the_p99_of_all_latencies() -> None:
    rng = np.random.default_rng(1)
    fast, slow = rng.uniform(500, 1500, 3000), rng.uniform(5000, 30000, 100)
    merged = MergedStats()
    for part in (fast, slow):
        stats = VersionStats()
        for us in part:
            stats.add(True, float(us))
        merged.add(stats.requests, stats.errors, stats.histogram())
    exact = float(np.percentile(np.concatenate([fast, slow]), 99)) / 1000
    assert exact <= merged.p99_ms() <= exact * 1.06  # the upper edge of a 5% bucket
    assert merged.requests == 3100 and merged.processes == 2


@pytest.mark.allow_log(FAILING_CANDIDATE)
def test_two_workers_roll_back_a_bad_candidate_together(tmp_path: Path) -> None:
    """``redline serve --workers 2``: traffic reaches both workers, the decision is taken on
    their sum, and after it every worker serves the baseline only."""
    import threading

    from tests.scaling.procs import CONFIG, Serve

    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    repo.add_onnx("affine", failing_affine())
    repo.promote("affine", 1)
    config = CONFIG + (f"project: {tmp_path}\nrepository: {tmp_path}/repo\n"
                       "models:\n  affine:\n    version_policy: all\n"
                       "batching:\n  max_batch_size: 1\n")
    serve = Serve(tmp_path, "--workers", "2", "--no-grpc", config=config).wait_ready()
    try:
        serve.wait_children(2)
        cfg = next(tmp_path.glob("redline-*.yaml"))
        cli("rollout", "start", "--config", str(cfg), "-m", "affine", "--candidate", "2",
            "--percent", "50", "--min-requests", "60")
        time.sleep(1.0)  # every worker polls the rollout file twice a second
        codes: list[tuple[int, str]] = []

        def load(n: int) -> None:
            for _ in range(n):  # a new connection each time: the kernel spreads them
                r = httpx.post(f"{serve.url}/v2/models/affine/infer", json=BIG, timeout=10)
                codes.append((r.status_code, r.json().get("model_version", "")))

        threads = [threading.Thread(target=load, args=(150,)) for _ in range(4)]
        for t in threads:
            t.start()
        doc = wait_state(tmp_path / "rollout.json", "affine", "rolled_back", timeout=30)
        for t in threads:
            t.join(60)
        assert "error rate" in doc["reason"]
        # A worker writes its counts to its stats file at most once a second, when a request
        # comes: requests to the baseline (the candidate gets none now) until both have.
        deadline = time.monotonic() + 30
        while True:
            files = [json.loads(p.read_text())
                     for p in (tmp_path / "rollout.json.stats").glob("*.json")]
            per_worker = [f["versions"].get("affine:2", {}).get("requests", 0) for f in files]
            if len(files) == 2 and all(n > 0 for n in per_worker):
                break  # both served it
            assert time.monotonic() < deadline, per_worker
            r = httpx.post(f"{serve.url}/v2/models/affine/infer", json=BIG, timeout=10)
            assert (r.status_code, r.json()["model_version"]) == (200, "1")
            time.sleep(0.05)
        failed = [c for c, _ in codes if c != 200]
        assert 60 <= len(failed) < 300, len(failed)  # stopped early: bounded damage
        after = [httpx.post(f"{serve.url}/v2/models/affine/infer", json=BIG, timeout=10)
                 for _ in range(60)]
        assert [(r.status_code, r.json()["model_version"]) for r in after] == [(200, "1")] * 60
    finally:
        assert serve.stop() == 0


def test_an_idle_server_keeps_writing_its_rollout_counts(project) -> None:  # type: ignore[no-untyped-def]
    """A worker that stops getting requests still writes its counts each second: `rollout
    status` reads every process's file and drops one older than 30 s, so an idle pool's counts
    must not go stale or vanish."""
    server, controller, config, root = project
    cli("rollout", "start", "--config", config, "-m", "affine", "--candidate", "4",
        "--percent", "50", "--min-requests", "100000")
    controller.refresh(force=True)
    with httpx.Client(base_url=server.http, timeout=10) as client:
        post(client, 20)
    stats = controller.file.stats_dir / f"{controller.instance}.json"
    wait_for(lambda: stats.exists() and sum(
        v["requests"] for v in json.loads(stats.read_text())["versions"].values()) == 20)
    written = json.loads(stats.read_text())["time"]
    # No request from here on: the server's own tick rewrites the file.
    wait_for(lambda: json.loads(stats.read_text())["time"] > written + 1.0, timeout=10)
    doc = json.loads(stats.read_text())
    assert sum(v["requests"] for v in doc["versions"].values()) == 20
    counts = aggregate_stats(controller.file)["versions"]
    assert sum(v["requests"] for v in counts.values()) == 20


class _Refused(_Record):
    def __init__(self, version: int, status: str = "invalid_input") -> None:
        super().__init__(version, True, 1000)
        self.status = status


def test_refusals_only_the_candidate_gives_are_its_errors(tmp_path: Path) -> None:
    """A client's mistakes come to both versions alike and count against neither; a 400 that
    only the candidate answers, on the same traffic, is the candidate's failure."""
    spec = RolloutSpec(model="m", baseline=1, candidate=2, min_requests=100)
    base, cand = VersionStats(), VersionStats()
    for i in range(400):  # 5% of the traffic is bad, whichever version gets it
        for stats in (base, cand):
            stats.refuse("invalid_input") if i % 20 == 0 else stats.add(True, 1000)
    assert decide_rollback(spec, base, cand) is None
    for _ in range(30):  # 30 more of the candidate's: 12% against 5% is within chance...
        cand.refuse("invalid_input")
    assert decide_rollback(spec, base, cand) is None
    for _ in range(50):  # ...80 more, 21% against 5%, is not
        cand.refuse("invalid_input")
    assert "the candidate refuses requests the baseline serves" in (
        decide_rollback(spec, base, cand) or "")
    # Through the controller: a candidate that refuses every request it is sent (no row of
    # its own is ever served) is rolled back once both versions have min_requests.
    file = RolloutFile(tmp_path / "rollout.json")
    file.write({"m": RolloutSpec(model="m", baseline=1, candidate=2, min_requests=100)})
    ctl = RolloutController(None, file.path, instance="a")
    for _ in range(300):
        ctl.request_finished(_Record(1, True, 1000))
    for _ in range(99):
        ctl.request_finished(_Refused(2))
    assert "m" in ctl.active
    ctl.request_finished(_Refused(2))
    assert "m" not in ctl.active
    doc = file.read()["m"]
    assert doc.state == "rolled_back" and doc.failed_check == "errors"
    assert "'invalid_input' answers 100.0% of 100 requests vs baseline 0.0%" in doc.reason


def test_a_candidate_with_other_inputs_is_refused_in_either_mode() -> None:
    def meta(version: int, inputs: list[str], names: list[str] | None = None) -> ModelMetadata:
        return ModelMetadata(name="m", version=version, sha256="",
                             inputs=[TensorSpec(n, "FP32", [-1, 4]) for n in inputs],
                             outputs=[TensorSpec("y", "FP32", [-1, 4])], feature_names=names)

    for mode in ("canary", "shadow"):
        why = unservable_candidate(meta(1, ["x"]), meta(2, ["z"]), mode)
        assert why is not None and "takes the inputs ['z'], version 1 takes ['x']" in why
    named, unnamed = meta(1, ["x"], list("abcd")), meta(2, ["x"])
    assert "records no feature_names" in (unservable_candidate(named, unnamed, "canary") or "")
    assert unservable_candidate(named, unnamed, "canary", v2_only=True) is None
    assert unservable_candidate(named, unnamed, "shadow") is None  # copies replay arrays
    assert unservable_candidate(meta(1, ["x"]), unnamed, "canary") is None  # V2 only anyway
    assert unservable_candidate(named, meta(2, ["x"], list("abce")), "canary") is None


@pytest.fixture()
def v1_project(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A model served on /v1 (v1 names its request fields) and a candidate that names none."""
    repo = ModelRepository(tmp_path / "models")
    repo.add_onnx("affine", affine_model(), feature_names=["a", "b", "c", "d"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the repository says v2 has no feature names)
        repo.add_onnx("affine", affine_model(width=3))
    assert repo.metadata("affine", 2).feature_names is None
    repo.promote("affine", 1)
    config = tmp_path / "redline.yaml"
    config.write_text("project: .\nrepository: models\nruntime:\n  warmup_batch_sizes: [1]\n"
                      "  warmup_runs: 1\nserver:\n  grpc_enabled: false\n"
                      "  watch_repository: false\nmodels:\n  affine:\n    version_policy: all\n")
    server = ServerThread(load_settings(config), repo)
    controller = install(server.server)
    server.start()
    try:
        yield server, controller, str(config), tmp_path
    finally:
        server.stop()


def test_a_v1_candidate_that_cannot_serve_is_refused_then_rolled_back(
        v1_project, capsys) -> None:  # type: ignore[no-untyped-def]
    server, controller, config, root = v1_project
    with pytest.raises(SystemExit) as refused:
        main(["rollout", "start", "--config", config, "-m", "affine", "--candidate", "2"])
    assert refused.value.code == 2
    said = capsys.readouterr().err
    assert "records no feature_names" in said and "--v2-only" in said, said
    assert not (root / "rollout.json").exists()
    # Started anyway (the operator said V2 only), /v1 traffic comes: the candidate answers
    # each of its share 400, the baseline serves the same requests, so it is rolled back.
    cli("rollout", "start", "--config", config, "-m", "affine", "--candidate", "2",
        "--percent", "30", "--min-requests", "20", "--v2-only")
    controller.refresh(force=True)
    body = {"request": {"a": 1, "b": 2, "c": 3, "d": 4}}
    codes = []
    with httpx.Client(base_url=server.http, timeout=10) as client:
        for _ in range(300):
            codes.append(client.post("/v1/models/affine/predict", json=body).status_code)
            if json.loads((root / "rollout.json").read_text())["rollouts"]["affine"][
                    "state"] != "running":
                break
        doc = wait_state(root / "rollout.json", "affine", "rolled_back")
        assert "'invalid_input'" in doc["reason"] and doc["failed_check"] == "errors", doc
        assert 20 <= codes.count(400) < 100, codes.count(400)  # bounded damage
        after = [client.post("/v1/models/affine/predict", json=body).status_code
                 for _ in range(20)]
    assert after == [200] * 20
    write_stats_now(controller)
    capsys.readouterr()
    cli("rollout", "status", "--config", config, "-m", "affine")
    assert "refused" in capsys.readouterr().out
