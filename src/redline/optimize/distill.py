"""Knowledge distillation: a narrow MLP student trained on the teacher's soft outputs.

The teacher labels many more rows than the tuning split holds (jittered and mixed-up copies), and
the student learns its probabilities, not just its argmax — a student learns more from "70% a 3,
25% an 8" than from "3". A classifier's student is a classifier: a softmax (or sigmoid) head
trained with cross-entropy on the teacher's probabilities, so its answers are probabilities too.
Only a regressor's student regresses. The student is exported through
``redline.models.convert`` (as a scikit-learn MLP carrying the trained weights), so it enters the
repository parity-checked, and takes the teacher's input and output names so clients do not
notice the swap.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx

from redline.errors import ConversionError
from redline.optimize.candidates import Candidate, Skipped, TuneContext
from redline.optimize.mlp import DenseNet, new_net, standardize_first_layer
from redline.optimize.prune import augment

STUDENT_SIZES: tuple[tuple[int, ...], ...] = ((64,), (32,))


def train_student(x: np.ndarray, target: np.ndarray, hidden: tuple[int, ...], output: str, *,
                  epochs: int = 60, seed: int = 0) -> DenseNet:
    """Fit a ReLU student on standardized inputs, then fold the scaling into its weights."""
    x = np.asarray(x, dtype=np.float64)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    t_mean, t_scale = np.zeros(target.shape[1]), np.ones(target.shape[1])
    if output == "identity":  # regression targets: standardize too, fold back afterwards
        t_mean, t_scale = target.mean(axis=0), target.std(axis=0)
        t_scale[t_scale < 1e-9] = 1.0
    net = new_net([x.shape[1], *hidden, target.shape[1]], "relu", output, seed=seed)
    net.fit((x - mean) / scale, (target - t_mean) / t_scale, epochs=epochs, batch_size=128,
            learning_rate=2e-3, seed=seed)
    net = standardize_first_layer(net, mean, scale)
    net.weights[-1] = net.weights[-1] * t_scale
    net.biases[-1] = net.biases[-1] * t_scale + t_mean
    return net


def to_sklearn(net: DenseNet, classes: list[Any] | None) -> Any:
    """A fitted-looking scikit-learn MLP holding ``net``'s weights (for the converter)."""
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.preprocessing import LabelBinarizer

    est: Any
    if classes is not None:
        est = MLPClassifier(hidden_layer_sizes=tuple(net.hidden_sizes), activation=net.activation)
        est.classes_ = np.asarray(classes)
        est._label_binarizer = LabelBinarizer().fit(est.classes_)
        est.out_activation_ = "logistic" if len(classes) == 2 else "softmax"
    else:
        est = MLPRegressor(hidden_layer_sizes=tuple(net.hidden_sizes), activation=net.activation)
        est.out_activation_ = "identity"
    est.coefs_ = [np.asarray(w, dtype=np.float64) for w in net.weights]
    est.intercepts_ = [np.asarray(b, dtype=np.float64) for b in net.biases]
    est.n_layers_ = len(net.weights) + 1
    est.n_outputs_ = net.weights[-1].shape[1]
    est.n_features_in_ = net.weights[0].shape[0]
    est.n_iter_ = len(net.history)
    return est


def rename_io(data: bytes, mapping: dict[str, str]) -> bytes:
    """Rename graph inputs/outputs (and every edge using them)."""
    mapping = {k: v for k, v in mapping.items() if k != v}
    if not mapping:
        return data
    model = onnx.load_from_string(data)
    for node in model.graph.node:
        for seq in (node.input, node.output):
            for i, name in enumerate(seq):
                if name in mapping:
                    seq[i] = mapping[name]
    for value in [*model.graph.input, *model.graph.output]:
        value.name = mapping.get(value.name, value.name)
    return model.SerializeToString()


def export_student(net: DenseNet, classes: list[Any] | None, sample: np.ndarray,
                   io_names: dict[str, str], head: str | None = None) -> bytes:
    """The student as ONNX. ``classes``: a scikit-learn style classifier (label and
    probabilities outputs). ``head`` (``Softmax`` or ``Sigmoid``): a classifier with one output,
    as a PyTorch module has, whose output is the head applied to the net's last layer."""
    from redline.models.convert import convert

    converted = convert(to_sklearn(net, classes), sample, tolerance=1e-3)
    data = converted.onnx_bytes
    if classes is None and net.weights[-1].shape[1] > 1:
        data = _keep_output_columns(data, converted.output_names[0], net.weights[-1].shape[1])
    mapping = {converted.input_name: io_names.get("input", converted.input_name)}
    if classes is None:
        scores = io_names.get("scores", converted.output_names[0])
        if head is not None:
            data = _with_head(data, converted.output_names[0], head, scores)
        else:
            mapping[converted.output_names[0]] = scores
    return rename_io(data, mapping)


def _with_head(data: bytes, output: str, head: str, name: str) -> bytes:
    """Apply ``head`` (Softmax over the columns, or Sigmoid) to ``output``; call the result
    ``name``."""
    model = onnx.load_from_string(data)
    logits = f"{output}_logits"
    for node in model.graph.node:
        for i, edge in enumerate(node.output):
            if edge == output:
                node.output[i] = logits
    node = onnx.helper.make_node(head, [logits], [name], name=f"student_{head}")
    if head == "Softmax":
        node.attribute.append(onnx.helper.make_attribute("axis", 1))
    model.graph.node.append(node)
    for value in model.graph.output:
        if value.name == output:
            value.name = name
    return model.SerializeToString()


def _keep_output_columns(data: bytes, output: str, columns: int) -> bytes:
    """skl2onnx reshapes a regressor's output to one column even with several outputs; put
    the columns back ([rows, k]) so the student matches a multi-output teacher."""
    from onnx import numpy_helper

    model = onnx.load_from_string(data)
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.output[0] == output and node.input[1] in inits:
            shape = np.array([-1, columns], dtype=np.int64)
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(shape, node.input[1]))
    for value in model.graph.output:
        if value.name == output:
            dims = value.type.tensor_type.shape.dim
            if len(dims) == 2:
                dims[1].dim_value = columns
    return model.SerializeToString()


def classifier_targets(scores: np.ndarray) -> tuple[str, np.ndarray, str, str | None]:
    """How to distill a classifier whose one output is ``scores``: (training head, targets,
    what the targets are, the head of the exported student or None).

    Probabilities (rows summing to one, or one column in [0, 1]) are learnt with a softmax
    (sigmoid) head and cross-entropy, and the student answers probabilities. Logits are turned
    into the probabilities they stand for and learnt the same way, and the student answers the
    logits before its head, so its output keeps the teacher's meaning.
    """
    scores = np.asarray(scores, dtype=np.float64)
    in_unit = bool(np.all(scores >= -1e-6) and np.all(scores <= 1 + 1e-6))
    if scores.shape[1] == 1:
        if in_unit:
            return "logistic", np.clip(scores, 0.0, 1.0), "probabilities", "Sigmoid"
        return "logistic", 1.0 / (1.0 + np.exp(-scores)), "logits", None
    if in_unit and np.allclose(scores.sum(axis=1), 1.0, atol=1e-3):
        return "softmax", np.clip(scores, 0.0, 1.0), "probabilities", "Softmax"
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return "softmax", e / e.sum(axis=1, keepdims=True), "logits", None


def distill_candidates(model: bytes, ctx: TuneContext,
                       sizes: tuple[tuple[int, ...], ...] | None = None
                       ) -> Iterator[Candidate | Skipped]:
    runner = ctx.teacher_runner
    if ctx.missing_values == "allow":
        yield Skipped("distill", "distill", "the original answers rows with missing values "
                      "(missing_values: allow) and an MLP student answers them NaN: it would "
                      "break the original's contract")
        return
    if len(ctx.x) == 0 or not np.isfinite(ctx.x).all():  # the optimizer passes finite rows
        yield Skipped("distill", "distill", "no fit rows without NaN or infinite values to "
                      "train a student on")
        return
    x = augment(ctx.x, 4 if ctx.fast else 6, ctx.seed)
    teacher = ctx.teacher_predict(x)
    sklearn_style = runner.label_name is not None and runner.score_name == "probabilities"
    classes = (ctx.class_labels or list(range(teacher.scores.shape[1]))) if sklearn_style \
        else None
    head: str | None = None
    if classes is not None and len(classes) == 2:
        output, target, kind = "logistic", teacher.scores[:, 1:2], "probabilities"
    elif classes is not None:
        output, target, kind = "softmax", teacher.scores, "probabilities"
    elif ctx.task == "classification":  # one output, as a PyTorch classifier has
        output, target, kind, head = classifier_targets(teacher.scores)
    else:
        output, target, kind = "identity", teacher.scores, "outputs"
    epochs = 30 if ctx.fast else 60
    io_names = {"input": runner.input_name, "scores": runner.score_name}
    for hidden in sizes or (STUDENT_SIZES[-1:] if ctx.fast else STUDENT_SIZES):
        name = "distill-mlp-" + "x".join(str(h) for h in hidden)
        net = train_student(x, target, hidden, output, epochs=epochs, seed=ctx.seed)
        try:
            data = export_student(net, classes, ctx.x[:64].astype(np.float32), io_names,
                                  head)
        except ConversionError as exc:
            yield Skipped(name, "distill", f"the student could not be exported: {exc}")
            continue
        yield Candidate(
            name, "distill", data, n_parameters=net.n_parameters,
            recipe={"student": "mlp", "hidden": list(hidden), "activation": "relu",
                    "epochs": epochs, "training_rows": int(len(x)), "head": output,
                    "loss": "squared error" if output == "identity" else "cross-entropy",
                    "targets": f"teacher {kind}", "augmentation": "gaussian jitter + mixup"},
            note=f"{'x'.join(map(str, hidden))}-unit MLP trained on the original's outputs",
        )
