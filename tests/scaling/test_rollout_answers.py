"""Rollouts judge the answers: a constant candidate is rolled back (canary and shadow), one
wrong per row is rolled back on its labels, an identical one is kept; status counts only the
current rollout."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import httpx
import numpy as np
import pytest

from redline.cli import main
from redline.config import load_settings
from redline.models import ModelRepository
from redline.monitoring.shift import prediction_shift
from redline.scaling.rollout import RolloutController, install
from tests.scaling.models import constant_affine, negated_affine, write_stats_now
from tests.serving.helpers import ServerThread, affine_model

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

BASELINE, CONSTANT, IDENTICAL, NEGATED = 1, 2, 3, 4


def run_cli(*args: str, code: int = 0) -> str:
    """``redline ARGS`` as a user runs it: its output (stdout, then stderr)."""
    out, err = io.StringIO(), io.StringIO()
    done: int | str | None = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            done = exc.code
    assert (done or 0) == code, (done, out.getvalue(), err.getvalue())
    return out.getvalue() + err.getvalue()


@pytest.fixture()
def project(tmp_path: Path) -> Iterator[tuple[ServerThread, RolloutController, str, Path]]:
    repo = ModelRepository(tmp_path / "models")
    repo.add_onnx("affine", affine_model())       # v1: the baseline
    repo.add_onnx("affine", constant_affine())    # v2: fast, error-free, always 0.5
    repo.add_onnx("affine", affine_model())       # v3: the baseline again
    repo.add_onnx("affine", negated_affine())     # v4: the baseline's distribution, wrong rows
    repo.promote("affine", BASELINE)
    config = tmp_path / "redline.yaml"
    config.write_text("project: .\nrepository: models\nruntime:\n  warmup_batch_sizes: [1]\n"
                      "  warmup_runs: 1\nbatching:\n  max_batch_size: 1\n"
                      "server:\n  watch_interval_s: 0.2\n  grpc_enabled: false\n"
                      "monitoring:\n  tick_s: 0.2\n"
                      "models:\n  affine:\n    version_policy: all\n")
    server = ServerThread(load_settings(config), repo)
    controller = install(server.server)
    server.start()
    try:
        yield server, controller, str(config), tmp_path
    finally:
        server.stop()


def body(rng: np.random.Generator, request_id: str | None = None) -> dict:  # type: ignore[type-arg]
    x = rng.normal(0, 1, 4).astype(np.float32)
    doc: dict = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",  # type: ignore[type-arg]
                             "data": x.tolist()}]}
    if request_id is not None:
        doc["id"] = request_id
    return doc


def state(root: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((root / "rollout.json").read_text())["rollouts"]["affine"]  # type: ignore[no-any-return]


def send_until(client: httpx.Client, rng: np.random.Generator, root: Path, done_state: str,
               limit: int) -> list[tuple[int, str]]:
    """Requests one at a time until the rollout reaches ``done_state`` (or ``limit``)."""
    answers = []
    for _ in range(limit):
        r = client.post("/v2/models/affine/infer", json=body(rng))
        answers.append((r.status_code, r.json().get("model_version", "")))
        if state(root)["state"] == done_state:
            break
    return answers


def status_json(config: str) -> dict:  # type: ignore[type-arg]
    out = run_cli("rollout", "status", "--config", config, "-m", "affine", "--json")
    return json.loads(out)  # type: ignore[no-any-return]


def test_canary_rolls_back_a_constant_candidate_on_its_answers(project, caplog) -> None:  # type: ignore[no-untyped-def]
    server, controller, config, root = project
    rng = np.random.default_rng(0)
    run_cli("rollout", "start", "--config", config, "-m", "affine", "--candidate",
            str(CONSTANT), "--percent", "50")
    controller.refresh(force=True)  # what the server's poll of the rollout file does, now
    with caplog.at_level(logging.WARNING, logger="redline.scaling"), \
            httpx.Client(base_url=server.http, timeout=10) as client:
        answers = send_until(client, rng, root, "rolled_back", 2000)
        doc = state(root)
        assert doc["state"] == "rolled_back", doc
        # No error, no slowness: the answers alone condemned it, after the minimum sample.
        assert all(code == 200 for code, _ in answers)
        assert doc["failed_check"] == "predictions" and "output" in doc["reason"], doc
        served = sum(v == str(CONSTANT) for _, v in answers)
        assert 200 <= served < 400, served
        after = [client.post("/v2/models/affine/infer", json=body(rng)).json()["model_version"]
                 for _ in range(30)]
        assert after == ["1"] * 30
        text = run_cli("rollout", "status", "--config", config, "-m", "affine")
        assert "rolled_back (predictions: predictions of output" in text, text
        server.server.monitor.refresh_metrics()
        metrics = client.get("/metrics").text
    assert 'redline_rollout_rollbacks_total{check="predictions",model="affine"} 1.0' in metrics
    lines = [r for r in caplog.records if "rolled back" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "PSI" in lines[0].getMessage()


def test_an_identical_candidate_is_kept_and_promoted(project) -> None:  # type: ignore[no-untyped-def]
    server, controller, config, root = project
    rng = np.random.default_rng(1)
    run_cli("rollout", "start", "--config", config, "-m", "affine", "--candidate",
            str(IDENTICAL), "--percent", "50")
    controller.refresh(force=True)
    with httpx.Client(base_url=server.http, timeout=10) as client:
        answers = send_until(client, rng, root, "rolled_back", 900)
    assert len(answers) == 900 and state(root)["state"] == "running", state(root)
    assert sum(v == str(IDENTICAL) for _, v in answers) > 300
    write_stats_now(controller)  # this process's counts and answers into its stats file
    shown = status_json(config)
    for output in ("y", "s"):
        shift = shown["answers"]["affine"][output]
        assert shift["candidate_rows"] >= 200 and not shift["shifted"], shift
    run_cli("rollout", "promote", "--config", config, "-m", "affine")
    assert ModelRepository(root / "models").resolve("affine", None) == IDENTICAL


def test_shadow_rolls_back_a_constant_candidate_but_keeps_an_identical_one(project) -> None:  # type: ignore[no-untyped-def]
    server, controller, config, root = project
    rng = np.random.default_rng(2)
    run_cli("rollout", "start", "--config", config, "-m", "affine", "--candidate",
            str(IDENTICAL), "--shadow", "--percent", "100")
    controller.refresh(force=True)
    with httpx.Client(base_url=server.http, timeout=10) as client:
        for _ in range(400):
            client.post("/v2/models/affine/infer", json=body(rng))
            time.sleep(0.002)  # let the copies run: beyond 4 in flight they are dropped
        shadow = controller.shadow["affine"]
        assert shadow.compared >= 250 and shadow.mismatched == 0
        assert state(root)["state"] == "running"
        run_cli("rollout", "abort", "--config", config, "-m", "affine")
        run_cli("rollout", "start", "--config", config, "-m", "affine", "--candidate",
                str(CONSTANT), "--shadow", "--percent", "100")
        controller.refresh(force=True)
        for _ in range(600):
            x = rng.normal(0, 1, 4).astype(np.float32)
            r = client.post("/v2/models/affine/infer", json={"inputs": [
                {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x.tolist()}]})
            # Shadow never changes an answer: the baseline's, right.
            assert r.json()["model_version"] == "1"
            assert np.allclose(r.json()["outputs"][0]["data"], 2 * x, rtol=1e-5)
            time.sleep(0.002)
            if state(root)["state"] == "rolled_back":
                break
    doc = state(root)
    assert doc["state"] == "rolled_back" and doc["failed_check"] == "mismatch", doc
    assert "shadow answers" in doc["reason"]
    text = run_cli("rollout", "status", "--config", config, "-m", "affine")
    assert "rolled_back (mismatch:" in text


def test_labels_roll_back_a_candidate_wrong_on_every_row(project) -> None:  # type: ignore[no-untyped-def]
    """Its answers have the baseline's distribution (inputs symmetric about 0), so only the
    labels show that each one is wrong."""
    server, controller, config, root = project
    rng = np.random.default_rng(3)
    run_cli("rollout", "start", "--config", config, "-m", "affine", "--candidate",
            str(NEGATED), "--percent", "50", "--min-labels", "40")
    controller.refresh(force=True)
    with httpx.Client(base_url=server.http, timeout=10) as client:
        labels = []
        for i in range(240):
            doc = body(rng, f"r{i}")
            assert client.post("/v2/models/affine/infer", json=doc).status_code == 200
            labels.append({"request_id": f"r{i}",
                           "label": float(np.sum(doc["inputs"][0]["data"]))})
        assert state(root)["state"] == "running"  # nothing else tells it apart
        joined = client.post("/v1/labels", json={"labels": labels}).json()
        assert joined["joined"] == 240, joined
        # Labels are judged every 2 s, on the server's loop, as requests come.
        answers = []
        deadline = time.monotonic() + 20
        while state(root)["state"] != "rolled_back" and time.monotonic() < deadline:
            answers += send_until(client, rng, root, "rolled_back", 20)
            time.sleep(0.05)
    doc = state(root)
    assert doc["state"] == "rolled_back" and doc["failed_check"] == "labels", (
        doc, len(answers), controller.label_losses)
    assert "realised loss" in doc["reason"]


def test_a_second_rollouts_status_counts_only_its_own_requests(project) -> None:  # type: ignore[no-untyped-def]
    server, controller, config, root = project
    rng = np.random.default_rng(4)
    with httpx.Client(base_url=server.http, timeout=10) as client:
        run_cli("rollout", "start", "--config", config, "-m", "affine", "--candidate",
                str(IDENTICAL), "--percent", "50")
        controller.refresh(force=True)
        for _ in range(150):
            client.post("/v2/models/affine/infer", json=body(rng))
        write_stats_now(controller)  # writes this process's stats file (once a second)
        first = status_json(config)["versions"]
        assert sum(v["requests"] for v in first.values()) == 150, first
        run_cli("rollout", "abort", "--config", config, "-m", "affine")
        run_cli("rollout", "start", "--config", config, "-m", "affine", "--candidate",
                str(IDENTICAL), "--percent", "50")
        assert status_json(config)["versions"] == {}  # none of the first rollout's
        controller.refresh(force=True)
        for _ in range(40):
            client.post("/v2/models/affine/infer", json=body(rng))
    write_stats_now(controller)
    second = status_json(config)["versions"]
    assert sum(v["requests"] for v in second.values()) == 40, second
    # The decision's own sums: this process's live counts, the first rollout's gone.
    assert controller.merged("affine", BASELINE).requests + \
        controller.merged("affine", IDENTICAL).requests == 40


def test_rollout_bounds_a_user_can_get_wrong_are_refused(project) -> None:  # type: ignore[no-untyped-def]
    _, _, config, _ = project
    for flag, value, words in (("--max-mismatch-rate", "2", "in [0, 1]"),
                               ("--min-answers", "0", "at least 1"),
                               ("--max-prediction-psi", "-1", ">= 0")):
        said = run_cli("rollout", "start", "--config", config, "-m", "affine", "--candidate",
                       "2", flag, value, code=2)
        assert said.startswith("error [invalid_input]") and words in said, said


def test_prediction_shift_tells_a_shift_from_noise() -> None:
    rng = np.random.default_rng(5)
    # Two samples of one distribution at the minimum sample (200 rows), 2,000 times over each,
    # as a rollout checks all day: never beyond the limit, whatever the output looks like. With
    # the raw shares and the 99.99th percentile, rounded values crossed it in ~0.4% of checks
    # and continuous ones in ~0.05% (an identical candidate was rolled back here).
    draws: dict[str, Callable[[int], np.ndarray]] = {
        "normal": lambda n: rng.normal(size=n),
        "skewed": lambda n: rng.exponential(size=n),
        "rounded": lambda n: np.round(rng.normal(size=n), 1),
        "a rare class": lambda n: (rng.random(n) < 0.03).astype(float)}
    for kind, draw in draws.items():
        shifts = [prediction_shift(draw(200), draw(200), 200, 200, 0.25) for _ in range(2000)]
        worst = max(s["psi"] / s["limit"] for s in shifts)
        assert worst < 1, (kind, worst)
    # What a rollout must still catch at the minimum sample: a constant, a rescaled score.
    base = rng.normal(size=200)
    assert prediction_shift(base, np.full(200, 0.5), 200, 200, 0.25)["shifted"]
    assert prediction_shift(base, 3 * rng.normal(size=200), 200, 200, 0.25)["shifted"]
    base = rng.normal(size=500)
    assert prediction_shift(base, np.full(500, 0.5), 500, 500, 0.25)["shifted"]  # constant
    assert prediction_shift(base, 3 * rng.normal(size=500), 500, 500, 0.25)["shifted"]
    # Discrete answers (a class) at the same rates; a constant answered with float noise.
    labels = (rng.random(1000) < 0.3).astype(float)
    assert not prediction_shift(labels, (rng.random(1000) < 0.3).astype(float), 1000, 1000,
                                0.25)["shifted"]
    assert prediction_shift(labels, (rng.random(1000) < 0.6).astype(float), 1000, 1000,
                            0.25)["shifted"]
    assert not prediction_shift(np.full(300, 0.7), np.full(300, 0.7) * (1 + 1e-5), 300, 300,
                                0.25)["shifted"]
