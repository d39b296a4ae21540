"""Train the two models, export them to ONNX, and write the three graph folders.

A multinomial logistic regression and an MLP (scikit-learn) on the hashed tokens of the
training tickets; both exported to ONNX from their weights (``probabilities``: rows x classes,
softmax). Three graph folders in ``--out``: ``cascade`` (the featurizer, the logistic model
answering the tickets it is sure of, the MLP the rest, the labels step), and ``logistic`` and
``mlp`` (each model alone between the same two Python steps), which ``run.sh`` adds as models
``textclf``, ``textclf_logistic`` and ``textclf_mlp``. Prints held-out accuracy of each, and of
the cascade with the share of tickets each of its models answers.

    python train.py --data data --out artifacts
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from featurize import BUCKETS, featurize
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).parent
HEAD = f"""inputs:
  text: {{datatype: BYTES, shape: [-1]}}
steps:
  features:
    kind: python
    function: steps.py:features
    inputs: [text]
    batch: true
    outputs: {{x: {{datatype: FP32, shape: [-1, {BUCKETS}]}}}}
"""
MODEL = """  {name}:
    kind: model
    model: {name}.onnx
    inputs: [features.x]
"""
CASCADE = """  classify:
    kind: cascade
    confidence: probabilities
    steps:
      - {{step: logistic, threshold: {threshold}}}
      - mlp
"""
TAIL = """  labels:
    kind: python
    function: steps.py:labels
    inputs: [{last}.probabilities]
    outputs:
      label: {{datatype: BYTES, shape: [-1]}}
      review: {{datatype: BOOL, shape: [-1]}}
outputs:
  label: labels.label
  review: labels.review
  probabilities: {last}.probabilities
"""


def read(path: Path) -> tuple[list[str], np.ndarray]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["text"] for r in rows], np.array([r["label"] for r in rows])


def dense_onnx(path: Path, layers: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """x -> (x W + b, ReLU between layers) -> softmax as ``probabilities``."""
    nodes, inits, last = [], [], "x"
    for i, (w, b) in enumerate(layers):
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(b.astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"z{i}"])]
        last = f"z{i}"
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [last], [f"h{i}"]))
            last = f"h{i}"
    nodes.append(helper.make_node("Softmax", [last], ["probabilities"], axis=1))
    classes = layers[-1][1].shape[0]
    graph = helper.make_graph(
        nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, BUCKETS])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, classes])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def graph_folder(folder: Path, models: dict[str, Path], yaml: str) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, source in models.items():
        shutil.copyfile(source, folder / name)
    for name in ("featurize.py", "steps.py"):
        shutil.copyfile(HERE / name, folder / name)
    (folder / "graph.yaml").write_text(yaml)


def main() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="data")
    parser.add_argument("--out", default="artifacts")
    parser.add_argument("--threshold", type=float, default=0.9,
                        help="the logistic model answers when its top probability reaches this")
    parser.add_argument("--hidden", type=int, default=512,
                        help="units in each of the MLP's two hidden layers")
    args = parser.parse_args()
    texts, y = read(Path(args.data) / "train.jsonl")
    test_texts, test_y = read(Path(args.data) / "test.jsonl")
    x, test_x = featurize(texts), featurize(test_texts)
    logistic = LogisticRegression(C=20.0, max_iter=500).fit(x, y)
    mlp = MLPClassifier(hidden_layer_sizes=(args.hidden, args.hidden), max_iter=60,
                        early_stopping=True, random_state=0).fit(x, y)
    out = Path(args.out)
    models = out / "models"
    models.mkdir(parents=True, exist_ok=True)
    dense_onnx(models / "logistic.onnx", [(logistic.coef_.T, logistic.intercept_)])
    dense_onnx(models / "mlp.onnx", list(zip(mlp.coefs_, mlp.intercepts_, strict=True)))
    files = {"logistic.onnx": models / "logistic.onnx", "mlp.onnx": models / "mlp.onnx"}
    cascade = (HEAD + MODEL.format(name="logistic") + MODEL.format(name="mlp")
               + CASCADE.format(threshold=args.threshold) + TAIL.format(last="classify")
               + "  answered_by: classify.answered_by\n")
    graph_folder(out / "cascade", files, cascade)
    for name in ("logistic", "mlp"):
        graph_folder(out / name, {f"{name}.onnx": files[f"{name}.onnx"]},
                     HEAD + MODEL.format(name=name) + TAIL.format(last=name))
    np.savez(out / "sample.npz", text=np.array(test_texts[:8], dtype=object).astype(str))
    p_log, p_mlp = logistic.predict_proba(test_x), mlp.predict_proba(test_x)
    sure = p_log.max(axis=1) >= args.threshold
    p_cascade = np.where(sure[:, None], p_log, p_mlp)
    for name, p in (("logistic", p_log), ("mlp", p_mlp), ("cascade", p_cascade)):
        print(f"held-out accuracy {name:9s} {(p.argmax(axis=1) == test_y).mean():.4f}")
    print(f"the cascade's logistic model answers {sure.mean():.1%} of tickets (threshold "
          f"{args.threshold}); graph folders in {out}/")


if __name__ == "__main__":
    main()
