"""`redline models add` of a general graph folder: what it refuses (one line, exit 2) and the
sample run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from redline.models import ModelRepository, load_runner
from tests.models.cli import run
from tests.serving.helpers import affine_model

STEPS = '''
import numpy as np

def pre(inputs):
    return {"x": inputs["raw"].astype(np.float32) * 2}

def post(inputs):
    return {"label": (inputs["s"] > 0).astype(np.int64)}

def wide(inputs):
    return {"x": np.zeros((len(inputs["raw"]), 8), np.float32)}
'''

GOOD = '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  pre: {kind: python, function: "steps.py:pre", inputs: [raw]}
  score: {kind: model, model: m.onnx, inputs: [pre.x]}
  post: {kind: python, function: "steps.py:post", inputs: [score.s]}
outputs:
  label: post.label
  y: score.y
'''


def graph(tmp_path: Path, text: str, steps: str = STEPS) -> Path:
    folder = tmp_path / "g"
    folder.mkdir(exist_ok=True)
    (folder / "graph.yaml").write_text(text)
    (folder / "steps.py").write_text(steps)
    (folder / "m.onnx").write_bytes(affine_model(4, 3.0, 0.0))
    np.save(tmp_path / "rows.npy", np.ones((3, 4), np.float32))
    return folder


def add(capsys: pytest.CaptureFixture[str], tmp_path: Path, folder: Path,
        *extra: str) -> tuple[int, str, str]:
    return run(capsys, "models", "add", "-m", "g", str(folder), "-r", str(tmp_path / "repo"),
               *extra)


def test_a_graph_is_added_with_its_sample_run_and_runs(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # its folder gets no bytecode
    monkeypatch.setattr("sys.dont_write_bytecode", False)
    folder = graph(tmp_path, GOOD)
    code, _, err = add(capsys, tmp_path, folder, "--sample", str(tmp_path / "rows.npy"))
    assert code == 2 and "step 'pre' runs Python code (steps.py:pre)" in err
    assert "--trust-code" in err
    code, out, err = add(capsys, tmp_path, folder, "--trust-code", "--sample",
                         str(tmp_path / "rows.npy"))
    assert code == 0, err
    assert "added graph g version 1 (3 steps; inputs ['raw'], outputs ['label', 'y'])" in out
    repo = ModelRepository(tmp_path / "repo")
    meta = repo.metadata("g")
    assert [(t.name, t.datatype, t.shape) for t in meta.outputs] == [
        ("label", "INT64", [-1]), ("y", "FP32", [-1, 4])]
    runner = load_runner(repo, "g")
    got = runner.run({"raw": np.array([[1, 1, 1, 1], [-1, -1, -1, -1]], np.float32)})
    assert got["label"].tolist() == [1, 0]
    np.testing.assert_allclose(got["y"], [[6] * 4, [-6] * 4])
    runner.close()
    code, out, err = run(capsys, "predict", "-m", "g", "-r", str(tmp_path / "repo"), "-i",
                         '{"raw": [[1, 1, 1, 1]]}')
    assert code == 0, err
    assert '"label": [1]' in out
    assert not list(repo.version_dir("g", 1).rglob("__pycache__"))
    assert not list(folder.rglob("__pycache__"))  # (the sample ran on a staged copy)
    (repo.version_dir("g", 1) / "steps.py").write_text(STEPS + "\n# changed\n")
    with pytest.raises(Exception, match="does not match its recorded sha256"):
        load_runner(repo, "g")


def test_a_folder_with_a_model_file_of_its_own_is_refused(capsys, tmp_path) -> None:
    folder = graph(tmp_path, GOOD)
    (folder / "model.py").write_text("")
    code, _, err = add(capsys, tmp_path, folder, "--trust-code")
    assert code == 2 and "the folder holds model.py" in err


def test_without_a_sample_an_undeclared_python_output_is_refused(capsys, tmp_path) -> None:
    folder = graph(tmp_path, GOOD)
    code, _, err = add(capsys, tmp_path, folder, "--trust-code")
    assert code == 2
    assert "output 'label' reads 'post.label'" in err and "--sample" in err


REFUSALS = [
    ("cycle", GOOD.replace("inputs: [raw]}", "inputs: [post.label]}"),
     "steps form a cycle (pre -> post -> score -> pre)"),
    ("missing input", GOOD.replace("inputs: [score.s]", "inputs: [score.nope]"),
     "step 'post' reads 'score.nope' but step 'score' has no output 'nope' (outputs: "
     "['y', 's'])"),
    ("unknown graph input", GOOD.replace("inputs: [raw]}", "inputs: [text]}"),
     "step 'pre' reads 'text', which is no graph input"),
    ("unknown step", GOOD.replace("[score.s]", "[scorer.s]"),
     "step 'post' reads 'scorer.s' but there is no step 'scorer'"),
    ("unknown kind", GOOD.replace("kind: model", "kind: modle"),
     "step 'score': unknown kind 'modle'"),
    ("shape", GOOD.replace('"steps.py:pre"', '"steps.py:wide", outputs: {x: {datatype: FP32, '
                                             'shape: [-1, 8]}}'),
     "step 'score': input 'x' reads pre.x (FP32 [-1, 8]) but m.onnx expects FP32 [-1, 4]"),
    ("dtype", GOOD.replace('"steps.py:pre"', '"steps.py:pre", outputs: {x: {datatype: FP64, '
                                             'shape: [-1, 4]}}'),
     "step 'score': input 'x' reads pre.x (FP64 [-1, 4]) but m.onnx expects FP32"),
    ("threshold", GOOD.replace("  post:", "  alt: {kind: model, model: m.onnx, inputs: [pre.x]}"
                               "\n  both: {kind: cascade, confidence: y, threshold: 1.5, "
                               "steps: [score, alt]}\n  post:").replace(
                                   "[score.s]", "[both.s]").replace("score.y", "both.y"),
     "cascade threshold"),
    ("python file as model", GOOD.replace("model: m.onnx", "model: m.py"),
     "step 'score': a Python model of the graph's folder is a folder holding model.py"),
    ("feeds nothing", GOOD.replace("  post:", "  idle: {kind: model, model: m.onnx, inputs: "
                                   "[pre.x]}\n  post:"),
     "step 'idle' feeds no output"),
]


@pytest.mark.parametrize(("case", "text", "said"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_broken_graph_is_refused_in_one_line_naming_the_step(capsys, tmp_path, case, text,
                                                               said) -> None:
    folder = graph(tmp_path, text)
    code, out, err = add(capsys, tmp_path, folder, "--trust-code", "--sample",
                         str(tmp_path / "rows.npy"))
    if case == "threshold":
        said = "the threshold of 'score' must be in (0, 1]"
    assert code == 2, out
    assert said in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "repo" / "g").exists()


def test_a_python_step_that_cannot_import_is_refused_naming_its_line(capsys, tmp_path) -> None:
    folder = graph(tmp_path, GOOD, steps=STEPS + "\ndef broken(:\n    pass\n")
    code, _, err = add(capsys, tmp_path, folder, "--trust-code", "--sample",
                       str(tmp_path / "rows.npy"))
    assert code == 2
    assert "step 'pre': cannot import steps.py: SyntaxError" in err
    assert "(steps.py, line 13)" in err and "fix the file" in err
    folder = graph(tmp_path, GOOD, steps="import not_a_package_here\n" + STEPS)
    code, _, err = add(capsys, tmp_path, folder, "--trust-code", "--sample",
                       str(tmp_path / "rows.npy"))
    assert code == 2 and "No module named 'not_a_package_here'" in err


def test_a_step_that_fails_on_the_sample_is_refused(capsys, tmp_path) -> None:
    folder = graph(tmp_path, GOOD, steps=STEPS.replace('inputs["s"] > 0',
                                                       'inputs["s"] > 0 + 1 / 0'))
    code, _, err = add(capsys, tmp_path, folder, "--trust-code", "--sample",
                       str(tmp_path / "rows.npy"))
    assert code == 2
    assert "the sample run failed" in err and "step 'post' raised ZeroDivisionError" in err


def test_a_step_that_hangs_or_answers_nan_or_off_its_outputs_is_refused(capsys,
                                                                        tmp_path) -> None:
    hang = STEPS.replace('def post(inputs):\n', 'def post(inputs):\n    import time\n'
                                                 '    time.sleep(30)\n')
    folder = graph(tmp_path, GOOD, steps=hang)
    code, _, err = add(capsys, tmp_path, folder, "--trust-code", "--timeout", "0.5",
                       "--sample", str(tmp_path / "rows.npy"))
    assert code == 2 and "the sample run did not finish within 0.5 s" in err
    assert "steps that answered: ['pre']" in err
    nan = STEPS.replace('* 2}', '* np.nan}')
    folder = graph(tmp_path, GOOD, steps=nan)
    code, _, err = add(capsys, tmp_path, folder, "--trust-code", "--sample",
                       str(tmp_path / "rows.npy"))
    assert code == 2 and "step 'pre' returned 'x' with NaN or infinity" in err
    folder = graph(tmp_path, """
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  pre:
    kind: python
    function: steps.py:pre
    inputs: [raw]
    outputs: {x: {datatype: FP64, shape: [-1, 4]}}
outputs:
  x: pre.x
""")
    code, _, err = add(capsys, tmp_path, folder, "--trust-code", "--sample",
                       str(tmp_path / "rows.npy"))
    assert code == 2
    assert "step 'pre' broke its declared outputs: output 'x' is float32" in err


def test_the_recommender_graph_format_still_goes_its_own_way(tmp_path) -> None:
    from redline.models.dag import is_dag

    assert not is_dag({"steps": [{"retrieve": {"k": 10}}, {"rank": {"model": "r.onnx"}}]})
    assert is_dag({"steps": {"a": {"kind": "model"}}})


def test_ensembles_vote_and_average(tmp_path) -> None:
    from redline.models.dag.spec import Step
    from redline.models.dag.steps import combine

    a = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], np.float32)
    b = np.array([[0.7, 0.3], [0.6, 0.4], [0.1, 0.9]], np.float32)
    c = np.array([[0.4, 0.6], [0.3, 0.7], [0.2, 0.8]], np.float32)
    answers = [{"p": a}, {"p": b}, {"p": c}]
    vote = combine(Step("e", "ensemble", members=["a", "b", "c"], method="vote", output="p"),
                   answers)
    assert vote["label"].tolist() == [0, 1, 1]
    np.testing.assert_allclose(vote["p"], [[2 / 3, 1 / 3], [1 / 3, 2 / 3], [1 / 3, 2 / 3]])
    mean = combine(Step("e", "ensemble", members=["a", "b", "c"], output="p"), answers)
    np.testing.assert_allclose(mean["p"], (a + b + c) / 3, rtol=1e-6)
    assert mean["p"].dtype == np.float32
    weighted = combine(Step("e", "ensemble", members=["a", "b", "c"], method="weighted_mean",
                            weights=[1, 0, 3], output="p"), answers)
    np.testing.assert_allclose(weighted["p"], (a + 3 * c) / 4, rtol=1e-6)
    labels = combine(Step("e", "ensemble", members=["a", "b", "c"], method="vote",
                          output="y"), [{"y": np.array([1, 2, 3])}, {"y": np.array([2, 2, 4])},
                                        {"y": np.array([1, 5, 6])}])
    assert labels["y"].tolist() == [1, 2, 3]  # the most common; a tie goes to the first step


SCORER = '''
import numpy as np


class Model:
    inputs = {"x": ("FP32", [-1, 4])}
    outputs = {"score": ("FP32", [-1])}

    def predict(self, inputs):
        return {"score": inputs["x"].sum(axis=1)}
'''


def test_in_folder_and_repository_models_and_the_load_check(tmp_path) -> None:
    folder = tmp_path / "g"
    (folder / "scorer").mkdir(parents=True)
    (folder / "scorer" / "model.py").write_text(SCORER)
    (folder / "graph.yaml").write_text('''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  mine: {kind: model, model: scorer/, inputs: [raw]}
  theirs: {kind: model, model: "affine:1", inputs: [raw]}
outputs:
  score: mine.score
  y: theirs.y
''')
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model(4, 3.0, 0.0))
    with pytest.raises(Exception, match="step 'mine' runs Python code"):
        repo.add_graph("g", folder)
    meta = repo.add_graph("g", folder, trust_code=True)
    assert [t.name for t in meta.outputs] == ["score", "y"]
    runner = load_runner(repo, "g")
    got = runner.run({"raw": np.ones((2, 4), np.float32)})
    assert got["score"].tolist() == [4.0, 4.0] and got["y"].tolist() == [[3.0] * 4] * 2
    runner.close()
    # the repository model's version 1 replaced by one of another width: refused at load
    import shutil

    shutil.rmtree(repo.root / "affine")
    repo.add_onnx("affine", affine_model(6, 3.0, 0.0))
    with pytest.raises(Exception, match="repository model affine:1 now takes"):
        load_runner(repo, "g")


def test_a_chain_runs_without_tasks_and_branches_as_a_dataflow() -> None:
    import yaml

    from redline.models.dag import Schedule, parse_dag

    def schedule(steps: str) -> Schedule:
        doc = yaml.safe_load(f"inputs: {{raw: {{datatype: FP32, shape: [-1, 4]}}}}\n{steps}")
        return Schedule(parse_dag(doc, "graph.yaml"))

    chain = schedule('''
steps:
  f: {kind: python, function: "s.py:f", inputs: [raw]}
  m1: {kind: model, model: a.onnx, inputs: [f.x]}
  m2: {kind: model, model: b.onnx, inputs: [f.x]}
  c: {kind: cascade, confidence: p, threshold: 0.9, steps: [m1, m2]}
  post: {kind: python, function: "s.py:g", inputs: [c.p]}
outputs: {y: post.y}''')
    assert chain.chain and chain.deps == {"f": [], "c": ["f"], "post": ["c"]}
    branches = schedule('''
steps:
  a: {kind: python, function: "s.py:a", inputs: [raw]}
  b: {kind: python, function: "s.py:b", inputs: [raw]}
  both: {kind: ensemble, steps: [a, b], output: y}
outputs: {y: both.y}''')
    assert not branches.chain and branches.deps["both"] == ["a", "b"]


CASCADE_STEPS = '''
import numpy as np

def broken(inputs):
    raise ValueError("no model today")

def sure(inputs):
    n = len(inputs["raw"])
    return {"p": np.tile(np.array([[0.1, 0.9]], np.float32), (n, 1))}

def unsure(inputs):
    n = len(inputs["raw"])
    return {"p": np.tile(np.array([[0.5, 0.5]], np.float32), (n, 1))}
'''


def cascade_graph(tmp_path: Path, members: list[str], fallback: str = "") -> Path:
    folder = tmp_path / "c"
    folder.mkdir(exist_ok=True)
    (folder / "steps.py").write_text(CASCADE_STEPS)
    steps = "".join(f"""  {m}: {{kind: python, function: "steps.py:{m}", inputs: [raw],
       outputs: {{p: {{datatype: FP32, shape: [-1, 2]}}}}}}
""" for m in members)
    listed = ", ".join(members)
    (folder / "graph.yaml").write_text(f"""
inputs:
  raw: {{datatype: FP32, shape: [-1, 4]}}
steps:
{steps}  c: {{kind: cascade, confidence: p, threshold: 0.8, steps: [{listed}]{fallback}}}
outputs:
  p: c.p
  by: c.answered_by
""")
    return folder


def test_a_cascade_passes_a_failed_steps_rows_on_and_falls_back_at_its_end(tmp_path) -> None:
    repo = ModelRepository(tmp_path / "repo")
    x = {"raw": np.ones((2, 4), np.float32)}
    repo.add_graph("c1", cascade_graph(tmp_path, ["unsure", "broken", "sure"]), trust_code=True)
    got = load_runner(repo, "c1").run(x)
    assert got["by"].tolist() == ["sure", "sure"]
    assert "step 'broken' failed (graph 'c1' step 'broken' raised ValueError: no model today" \
        in got["degraded"][0] and "'sure' answered its rows" in got["degraded"][0]
    repo.add_graph("c2", cascade_graph(
        tmp_path, ["unsure", "broken"], ", fallback: {value: {p: [1, 0], answered_by: none}}"),
        trust_code=True)
    got = load_runner(repo, "c2").run(x)
    assert got["p"].tolist() == [[1.0, 0.0]] * 2 and got["by"].tolist() == ["none"] * 2
    assert "step 'c' failed (model_error)" in got["degraded"][0]
    repo.add_graph("c3", cascade_graph(tmp_path, ["unsure", "broken"]), trust_code=True)
    with pytest.raises(Exception, match="step 'broken' raised ValueError: no model today"):
        load_runner(repo, "c3").run(x)
