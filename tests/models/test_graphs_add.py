"""`redline models add` of a general graph folder: what it refuses (one line, exit 2) and the
sample run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from redline.cli import main
from redline.models import ModelRepository, load_runner
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


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


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


def test_a_graph_is_added_with_its_sample_run_and_runs(capsys, tmp_path) -> None:
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
    (repo.version_dir("g", 1) / "steps.py").write_text(STEPS + "\n# changed\n")
    with pytest.raises(Exception, match="does not match its recorded sha256"):
        load_runner(repo, "g")


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


def test_the_recommender_graph_format_still_goes_its_own_way(tmp_path) -> None:
    from redline.models.dag import is_dag

    assert not is_dag({"steps": [{"retrieve": {"k": 10}}, {"rank": {"model": "r.onnx"}}]})
    assert is_dag({"steps": {"a": {"kind": "model"}}})
