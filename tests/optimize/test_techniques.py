"""Each optimization technique on small real models: it applies where it should, says why where
it does not, and its candidates stay within tolerance on rows it never saw."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from redline.optimize import Candidate, Skipped
from redline.optimize.distill import distill_candidates
from redline.optimize.prune import (
    magnitude_candidates,
    parameter_count,
    prune_sklearn_mlp,
    prune_torch_sequential,
    structured_candidates,
)
from redline.optimize.quantize import (
    dynamic_int8,
    fp16_candidates,
    quantizable_nodes,
    quantize_candidates,
    static_int8,
)
from redline.optimize.trees import n_trees, tree_candidates
from tests.optimize.conftest import held_out, tune_context

DIGITS = list(range(10))


def _split(items: list) -> tuple[dict[str, Candidate], dict[str, Skipped]]:
    cands = {c.name: c for c in items if isinstance(c, Candidate)}
    skipped = {s.name: s for s in items if isinstance(s, Skipped)}
    return cands, skipped


def _relative_loss(before: float, after: float) -> float:
    return (before - after) / before


def _initializer_sizes(data: bytes) -> dict[str, int]:
    model = onnx.load_from_string(data)
    return {i.name: int(np.prod(i.dims)) for i in model.graph.initializer}


# ------------------------------------------------------------------------- quantization
@pytest.mark.slow
def test_int8_dynamic_and_static_stay_within_tolerance(digits, digits_mlp, onnx_of):
    model = onnx_of(digits_mlp, digits.x_train)
    ctx = tune_context(model, digits, DIGITS)
    cands, skipped = _split(list(quantize_candidates(model, ctx, methods=("minmax", "entropy",
                                                                          "percentile"))))
    assert {"int8-dynamic", "int8-static-minmax", "int8-static-entropy",
            "int8-static-percentile"} <= set(cands), skipped
    base = held_out(model, digits, DIGITS)["accuracy"]
    for cand in cands.values():
        acc = held_out(cand.onnx_bytes, digits, DIGITS)["accuracy"]
        assert _relative_loss(base, acc) <= 0.01, (cand.name, base, acc)
        # int8 weights really are stored: the file shrinks by well over half
        assert len(cand.onnx_bytes) < 0.5 * len(model), cand.name
        kinds = {i.data_type for i in onnx.load_from_string(cand.onnx_bytes).graph.initializer}
        assert onnx.TensorProto.INT8 in kinds
    static = cands["int8-static-minmax"].recipe
    assert static["calibration"] == "minmax" and static["per_channel"] is True


def test_excluded_node_stays_in_float(digits, digits_mlp, onnx_of):
    model = onnx_of(digits_mlp, digits.x_train)
    nodes = quantizable_nodes(onnx.load_from_string(model))
    assert len(nodes) == 2  # hidden and output layer
    quantized = onnx.load_from_string(static_int8(model, digits.x_val[:200], exclude=[nodes[-1]]))
    by_name = {n.name: n for n in quantized.graph.node}
    # the excluded output layer still multiplies by its float weights, the hidden one does not
    assert by_name[nodes[-1]].op_type == "MatMul"
    float_weights = {i.name for i in quantized.graph.initializer
                     if i.data_type == onnx.TensorProto.FLOAT}
    assert by_name[nodes[-1]].input[1] in float_weights
    assert any(n.op_type == "DequantizeLinear" for n in quantized.graph.node)
    assert dynamic_int8(model, exclude=nodes) != dynamic_int8(model)


def test_static_gives_up_with_reason_when_no_exclusion_is_enough(digits, digits_mlp, onnx_of):
    model = onnx_of(digits_mlp, digits.x_train)
    ctx = tune_context(model, digits, DIGITS, tolerance=-0.5)  # demand 50% better: impossible
    _, skipped = _split(list(quantize_candidates(model, ctx, methods=("minmax",))))
    reason = skipped["int8-static-minmax"].reason
    assert "kept in float" in reason and "tolerance" in reason


def test_quantization_and_fp16_say_why_they_do_not_apply(digits, digits_forest, onnx_of):
    model = onnx_of(digits_forest, digits.x_train)
    ctx = tune_context(model, digits, DIGITS)
    _, skipped = _split(list(quantize_candidates(model, ctx)))
    assert "no MatMul/Gemm" in skipped["int8"].reason
    _, skipped = _split(list(fp16_candidates(model, ctx)))
    assert "GPU" in skipped["fp16"].reason  # this machine's onnxruntime has no CUDA provider


# ------------------------------------------------------------------------- pruning
def test_structured_pruning_shrinks_the_graph_and_stays_close(digits, digits_mlp, onnx_of):
    model = onnx_of(digits_mlp, digits.x_train)
    ctx = tune_context(model, digits, DIGITS)
    cands, _ = _split(list(structured_candidates(model, ctx, ratios=(0.5,))))
    pruned = cands["prune-50"]
    before, after = _initializer_sizes(model), _initializer_sizes(pruned.onnx_bytes)
    assert after["coefficient"] == before["coefficient"] // 2  # 64x64 -> 64x32
    assert after["coefficient1"] == before["coefficient1"] // 2  # 64x10 -> 32x10
    assert parameter_count(onnx.load_from_string(pruned.onnx_bytes)) < \
        0.6 * parameter_count(onnx.load_from_string(model))
    assert pruned.recipe["hidden_before"] == [64] and pruned.recipe["hidden_after"] == [32]
    base = held_out(model, digits, DIGITS)["accuracy"]
    assert _relative_loss(base, held_out(pruned.onnx_bytes, digits, DIGITS)["accuracy"]) <= 0.02


def test_structured_pruning_sees_through_a_scaler(cancer, cancer_mlp, onnx_of):
    model = onnx_of(cancer_mlp, cancer.x_train)
    ctx = tune_context(model, cancer, [0, 1], metric="roc_auc")
    cands, skipped = _split(list(structured_candidates(model, ctx, ratios=(0.5,))))
    assert "prune-50" in cands, skipped
    metrics = held_out(cands["prune-50"].onnx_bytes, cancer, [0, 1])
    base = held_out(model, cancer, [0, 1])
    assert _relative_loss(base["roc_auc"], metrics["roc_auc"]) <= 0.01


def test_magnitude_pruning_is_reported_honestly(digits, digits_mlp, onnx_of):
    model = onnx_of(digits_mlp, digits.x_train)
    ctx = tune_context(model, digits, DIGITS)
    cands, _ = _split(list(magnitude_candidates(model, ctx, sparsities=(0.5,))))
    cand = cands["magnitude-50"]
    # same dense shapes (no speed-up possible), but half the weights are zero
    assert _initializer_sizes(cand.onnx_bytes) == _initializer_sizes(model)
    weights = numpy_helper.to_array(next(i for i in onnx.load_from_string(cand.onnx_bytes)
                                         .graph.initializer if i.name == "coefficient"))
    assert 0.45 <= float(np.mean(weights == 0)) <= 0.55
    assert "no speed-up" in cand.note
    assert cand.n_parameters is not None and cand.n_parameters < parameter_count(
        onnx.load_from_string(model))


def test_pruning_skips_models_that_are_not_mlps(digits, digits_forest, onnx_of):
    model = onnx_of(digits_forest, digits.x_train)
    _, skipped = _split(list(structured_candidates(model, tune_context(model, digits, DIGITS))))
    assert "not a plain MLP" in skipped["prune"].reason


def test_prune_sklearn_mlp_with_warm_start(digits, digits_mlp):
    from redline.models.convert import convert

    pruned = prune_sklearn_mlp(digits_mlp, digits.x_train, 0.5, y=digits.y_train,
                               fine_tune_iter=10)
    assert [w.shape for w in pruned.coefs_] == [(64, 32), (32, 10)]
    assert digits_mlp.coefs_[0].shape == (64, 64)  # the original is untouched
    assert pruned.score(digits.x_val, digits.y_val) >= digits_mlp.score(digits.x_val,
                                                                         digits.y_val) - 0.03
    converted = convert(pruned, digits.x_val[:32])  # still a valid, parity-checked model
    assert converted.max_abs_diff < 1e-4


def test_prune_torch_sequential_shrinks_linear_layers(digits):
    torch = pytest.importorskip("torch")
    from torch import nn

    from redline.models.convert import convert

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 24), nn.ReLU(),
                           nn.Linear(24, 10))
    pruned = prune_torch_sequential(module, digits.x_train[:400], 0.5, epochs=5)
    assert [m.out_features for m in pruned if isinstance(m, nn.Linear)] == [24, 12, 10]
    assert sum(p.numel() for p in pruned.parameters()) < 0.6 * sum(
        p.numel() for p in module.parameters())
    before = convert(module, digits.x_val[:16]).onnx_bytes
    after = convert(pruned, digits.x_val[:16]).onnx_bytes
    assert parameter_count(onnx.load_from_string(after)) < parameter_count(
        onnx.load_from_string(before))
    # and the registered-ONNX path finds the Gemm chain a torch export makes
    from redline.optimize.dense import find_dense_chain

    chain = find_dense_chain(onnx.load_from_string(before))
    assert chain is not None and chain.net.hidden_sizes == [48, 24]


# ------------------------------------------------------------------------- trees
def test_fewer_trees_for_a_forest(digits, digits_forest, onnx_of):
    model = onnx_of(digits_forest, digits.x_train)
    ctx = tune_context(model, digits, DIGITS)
    cands, _ = _split(list(tree_candidates(model, ctx, fractions=(0.5,))))
    cand = cands["trees-30of60"]
    assert n_trees(onnx.load_from_string(cand.onnx_bytes)) == 30
    assert cand.recipe["weights_scaled"] is True  # averaging ensemble: weights rescaled
    assert len(cand.onnx_bytes) < 0.6 * len(model)
    base = held_out(model, digits, DIGITS)["accuracy"]
    assert _relative_loss(base, held_out(cand.onnx_bytes, digits, DIGITS)["accuracy"]) <= 0.02


@pytest.mark.parametrize("library", ["lightgbm", "xgboost"])
def test_fewer_trees_for_a_boosted_model_keeps_the_raw_sum(cancer, onnx_of, library):
    """Boosting's first K trees are the model after K rounds: no rescaling, and its held-out
    probabilities are the library's own (num_iteration=K), better calibrated than scaled ones."""
    from redline.optimize.trees import keep_trees

    if library == "lightgbm":
        lib = pytest.importorskip("lightgbm")
        booster = lib.LGBMClassifier(n_estimators=80, num_leaves=8, verbose=-1).fit(
            cancer.x_train, cancer.y_train)
        own = booster.predict_proba(cancer.x_val, num_iteration=20)
    else:
        lib = pytest.importorskip("xgboost")
        booster = lib.XGBClassifier(n_estimators=80, max_depth=3).fit(
            cancer.x_train, cancer.y_train)
        own = booster.predict_proba(cancer.x_val, iteration_range=(0, 20))
    model = onnx_of(booster, cancer.x_train)
    ctx = tune_context(model, cancer, [0, 1])
    cands, _ = _split(list(tree_candidates(model, ctx, fractions=(0.25,))))
    cand = cands["trees-20of80"]
    assert n_trees(onnx.load_from_string(cand.onnx_bytes)) == 20
    assert cand.recipe["weights_scaled"] is False and cand.recipe["decided_by"] == "log_loss"
    kept = held_out(cand.onnx_bytes, cancer, [0, 1])
    scaled = held_out(keep_trees(model, 20, 4.0), cancer, [0, 1])
    half = len(cancer.x_val) // 2
    expected = -np.mean(np.log(np.clip(own[half:][np.arange(len(own) - half),
                                                   cancer.y_val[half:]], 1e-15, 1)))
    assert kept["log_loss"] == pytest.approx(expected, rel=1e-3)
    assert kept["log_loss"] < scaled["log_loss"]


# ------------------------------------------------------------------------- distillation
def test_distilled_student_is_smaller_and_within_tolerance(digits, digits_forest, onnx_of):
    model = onnx_of(digits_forest, digits.x_train)
    ctx = tune_context(model, digits, DIGITS, on_train=True)
    cands, skipped = _split(list(distill_candidates(model, ctx, sizes=((32,),))))
    student = cands["distill-mlp-32"]
    assert len(student.onnx_bytes) < 0.2 * len(model)
    base = held_out(model, digits, DIGITS)["accuracy"]
    acc = held_out(student.onnx_bytes, digits, DIGITS)["accuracy"]
    assert _relative_loss(base, acc) <= 0.01, (base, acc)
    # a drop-in replacement: same input and output names and label type as the teacher
    teacher, pupil = onnx.load_from_string(model).graph, onnx.load_from_string(
        student.onnx_bytes).graph
    assert [i.name for i in pupil.input] == [i.name for i in teacher.input]
    assert [(o.name, o.type.tensor_type.elem_type) for o in pupil.output] == \
        [(o.name, o.type.tensor_type.elem_type) for o in teacher.output]


def test_distilled_binary_student(cancer, cancer_mlp, onnx_of):
    model = onnx_of(cancer_mlp, cancer.x_train)
    ctx = tune_context(model, cancer, [0, 1], metric="roc_auc", on_train=True)
    cands, _ = _split(list(distill_candidates(model, ctx, sizes=((8,),))))
    metrics = held_out(cands["distill-mlp-8"].onnx_bytes, cancer, [0, 1])
    base = held_out(model, cancer, [0, 1])
    assert _relative_loss(base["roc_auc"], metrics["roc_auc"]) <= 0.01


def _torch_classifier(digits, final: str):
    """A PyTorch digits classifier that declares its classes: one output, probabilities
    (``final="softmax"``) or logits (``final="logits"``), converted as the repository does."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from redline.models.convert import convert

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    x, target = torch.as_tensor(digits.x_train), torch.as_tensor(digits.y_train)
    for _ in range(80):
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(x), target).backward()
        optimizer.step()
    module = nn.Sequential(net, nn.Softmax(dim=1)) if final == "softmax" else net
    setattr(module, "classes_", DIGITS)  # noqa: B010 - a module declares its classes
    converted = convert(module, digits.x_train[:16])
    assert converted.task == "classification" and converted.output_names == ["output"]
    return converted.onnx_bytes


def _answers(model: bytes, rows: np.ndarray) -> np.ndarray:
    from redline.optimize import ModelRunner

    return ModelRunner(model, task="classification", class_labels=DIGITS).predict(rows).scores


def test_a_one_output_classifier_gets_a_student_that_answers_probabilities(digits):
    model = _torch_classifier(digits, "softmax")
    ctx = tune_context(model, digits, DIGITS, on_train=True)
    cands, _ = _split(list(distill_candidates(model, ctx, sizes=((32,),))))
    student = cands["distill-mlp-32"]
    half = len(digits.x_val) // 2
    scores = _answers(student.onnx_bytes, digits.x_val[half:])
    assert scores.shape == (len(digits.x_val) - half, 10)
    assert scores.min() >= 0.0 and scores.max() <= 1.0
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-5)
    assert student.recipe["head"] == "softmax" and student.recipe["loss"] == "cross-entropy"
    graph = onnx.load_from_string(student.onnx_bytes).graph
    assert [o.name for o in graph.output] == ["output"]  # a drop-in replacement
    base = held_out(model, digits, DIGITS)
    pupil = held_out(student.onnx_bytes, digits, DIGITS)
    assert _relative_loss(base["accuracy"], pupil["accuracy"]) <= 0.03, (base, pupil)
    assert pupil["log_loss"] < 2 * base["log_loss"]  # probabilities, not rescaled guesses


def test_a_logit_classifier_gets_a_student_that_answers_logits(digits):
    model = _torch_classifier(digits, "logits")
    ctx = tune_context(model, digits, DIGITS, on_train=True)
    cands, _ = _split(list(distill_candidates(model, ctx, sizes=((32,),))))
    student = cands["distill-mlp-32"]
    assert student.recipe["targets"] == "teacher logits"
    assert student.recipe["loss"] == "cross-entropy"
    rows = digits.x_val[len(digits.x_val) // 2:]
    teacher, pupil = _answers(model, rows), _answers(student.onnx_bytes, rows)
    assert pupil.min() < 0.0 or pupil.max() > 1.0  # logits, as the teacher answers

    def softmax(z: np.ndarray) -> np.ndarray:
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    # the probabilities its logits stand for are the teacher's, near enough
    assert np.mean(np.argmax(pupil, axis=1) == np.argmax(teacher, axis=1)) > 0.9
    assert np.abs(softmax(pupil) - softmax(teacher)).sum(axis=1).mean() < 0.3


# ------------------------------------------------------------------------- quantization
def test_int8_dynamic_falls_back_to_the_registered_graph_of_a_scaler_pipeline(
        cancer, cancer_mlp, onnx_of):
    # ONNX Runtime's pre-processing folds the StandardScaler into the graph in a form its
    # dynamic quantizer cannot type; the registered graph quantizes fine
    model = onnx_of(cancer_mlp, cancer.x_train)
    ctx = tune_context(model, cancer, [0, 1], tolerance=0.05)
    cands, skipped = _split(list(quantize_candidates(model, ctx, methods=("minmax",))))
    assert "int8-dynamic" not in skipped, skipped.get("int8-dynamic")
    dynamic = cands["int8-dynamic"]
    assert dynamic.recipe["preprocessed"] is False
    assert "quantized as registered" in dynamic.recipe["preprocess_note"]
    ops = {n.op_type for n in onnx.load_from_string(dynamic.onnx_bytes).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"}
    base, quantized = held_out(model, cancer, [0, 1]), held_out(dynamic.onnx_bytes, cancer, [0, 1])
    assert _relative_loss(base["accuracy"], quantized["accuracy"]) <= 0.05
