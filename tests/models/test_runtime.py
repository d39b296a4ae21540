"""The ONNX Runtime engine: loading, settings, warm-up and every validation error."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from redline.config import RuntimeSettings
from redline.errors import ConfigError, InvalidInput, ProviderUnavailable
from redline.models import InferenceSession, choose_providers, runtime


@pytest.fixture()
def session(repo, classifier_onnx, breast_cancer):
    repo.add_onnx("bc", classifier_onnx, class_labels=[0, 1], sample=breast_cancer[0])
    return InferenceSession.load(repo, "bc")


def _identity_model(datatype: int, shape: list) -> bytes:
    inp = helper.make_tensor_value_info("x", datatype, shape)
    out = helper.make_tensor_value_info("y", datatype, shape)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id", [inp], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_run_matches_validated_inputs(session, breast_cancer):
    x, _ = breast_cancer
    out = session.run(session.validate({"X": x[:5]}))
    assert out["probabilities"].shape == (5, 2)
    np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
    assert session.describe()["providers"] == ["CPUExecutionProvider"]


def test_json_style_inputs_are_cast_safely(session, breast_cancer):
    rows = breast_cancer[0][:2].astype(np.float64).tolist()  # JSON numbers arrive as float64
    validated = session.validate({"X": rows})
    assert validated["X"].dtype == np.float32
    ints = session.validate({"X": np.ones((1, 30), dtype=np.int64)})
    assert ints["X"].dtype == np.float32


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({}, "missing input 'X'"),
        ({"X": [[1.0] * 30], "Z": [1]}, r"unknown input\(s\) \['Z'\]"),
        ({"X": [1.0] * 30}, r"shape \[30\] but the model expects \[-1, 30\]"),
        ({"X": [[1.0] * 29]}, "has 29 along axis 1 but the model expects 30"),
        ({"X": [[1.0] * 30, [1.0] * 29]}, "not a rectangular array"),
        ({"X": [["a"] * 30]}, "holds strings/objects but the model expects FP32"),
        ({"X": [[True] * 30]}, "holds booleans"),
        ({"X": [[2**30] * 30]}, "integers above 16777216"),
        ({"X": [[1e300] * 30]}, "beyond the range of FP32"),
        ({"X": [[float("nan")] + [1.0] * 29]}, r"NaN or infinity \(first at index \[0, 0\]\)"),
        ({"X": [[1.0] * 29 + [float("inf")]]}, r"NaN or infinity \(first at index \[0, 29\]\)"),
    ],
)
def test_validation_errors_say_what_was_expected(session, inputs, message):
    with pytest.raises(InvalidInput, match=message):
        session.validate(inputs)


def test_nan_allowed_when_model_declares_it(repo, classifier_onnx):
    repo.add_onnx("bc", classifier_onnx, missing_values="allow")
    session = InferenceSession.load(repo, "bc")
    row = np.full((1, 30), np.nan, dtype=np.float32)
    assert session.validate({"X": row})["X"].shape == (1, 30)


def test_integer_inputs_range_checked(repo):
    repo.add_onnx("i8", _identity_model(TensorProto.INT8, [None, 2]))
    session = InferenceSession.load(repo, "i8")
    assert session.validate({"x": [[1, -2]]})["x"].dtype == np.int8
    with pytest.raises(InvalidInput, match=r"outside the range of INT8"):
        session.validate({"x": [[300, 1]]})
    with pytest.raises(InvalidInput, match="cannot be safely cast to INT8"):
        session.validate({"x": [[1.5, 2.0]]})


def test_batch_sizes_must_agree_across_inputs(repo):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 1])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, 1])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "add", [a, b], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    repo.add_onnx("add", model.SerializeToString())
    session = InferenceSession.load(repo, "add")
    with pytest.raises(InvalidInput, match="every input needs the same batch size"):
        session.validate({"a": [[1.0], [2.0]], "b": [[1.0]]})
    out_arr = session.run(session.validate({"a": [[1.0]], "b": [[2.0]]}))["y"]
    assert out_arr.tolist() == [[3.0]]


def test_settings_threads_optimized_graph_and_warmup(repo, classifier_onnx, tmp_path):
    repo.add_onnx("bc", classifier_onnx)
    settings = RuntimeSettings(
        intra_op_threads=2,
        graph_optimization="extended",
        optimized_model_dir=str(tmp_path / "opt"),
        warmup_batch_sizes=[1, 4],
        warmup_runs=1,
    )
    session = InferenceSession.load(repo, "bc", settings=settings)
    session.warmup()
    saved = tmp_path / "opt" / "bc-1.optimized.onnx"
    assert saved.is_file()
    onnx.checker.check_model(onnx.load(str(saved)))


def test_bad_settings_and_absent_provider_are_clear(repo, classifier_onnx):
    repo.add_onnx("bc", classifier_onnx)
    with pytest.raises(ConfigError, match="graph_optimization must be one of"):
        InferenceSession.load(repo, "bc", settings=RuntimeSettings(graph_optimization="max"))
    with pytest.raises(ConfigError, match=r"\['CUDAProvider'\] is not an ONNX Runtime execution"):
        InferenceSession.load(repo, "bc", settings=RuntimeSettings(providers=["CUDAProvider"]))
    # Measurements refuse a provider the build lacks: a CPU fallback would give wrong numbers.
    with pytest.raises(ProviderUnavailable, match=r"\['CUDAExecutionProvider'\].*onnxruntime-gpu"):
        choose_providers(["CUDAExecutionProvider"])


def test_a_gpu_provider_this_build_lacks_serves_on_the_cpu_and_says_so(
        repo, classifier_onnx, caplog, monkeypatch):
    monkeypatch.setattr(runtime, "_warned", set())  # as in a fresh process
    assert "CUDAExecutionProvider" not in ort.get_available_providers(), \
        "the suite runs on the CPU build of onnxruntime (the dev extra installs it)"
    repo.add_onnx("bc", classifier_onnx)
    gpu = RuntimeSettings(providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    with caplog.at_level(logging.WARNING, logger="redline.models"):
        first = InferenceSession.load(repo, "bc", settings=gpu)
        second = InferenceSession.load(repo, "bc", settings=gpu)
    assert first.providers == second.providers == ["CPUExecutionProvider"]
    assert first.provider_fallback == second.provider_fallback
    assert first.provider_fallback is not None
    assert "CUDAExecutionProvider is not in this onnxruntime build" in first.provider_fallback
    assert "redline[gpu]" in first.provider_fallback
    said = [r.getMessage() for r in caplog.records if "runtime.providers" in r.getMessage()]
    assert said == [first.provider_fallback]  # once a process, not once a model
    assert InferenceSession.load(repo, "bc").provider_fallback is None  # the default: CPU
