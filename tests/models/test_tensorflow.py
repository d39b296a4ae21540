"""Keras 3 ``.keras`` files and TensorFlow SavedModels: converted to ONNX with their signature's
names (several inputs allowed), held to the original on the sample, refused by operator name;
then added, served, optimized and gated through the real ``redline`` command. Every model is
built here, tiny, so the file runs in seconds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from redline.errors import ConversionError
from redline.models import ModelRepository
from redline.models.convert import convert, detect_framework, is_saved_model
from redline.models.convert import from_tensorflow as tf_convert
from tests.optimize.conftest import run_cli

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def tf() -> Any:
    return tf_convert.import_tensorflow()  # quiets TensorFlow's start-up lines as redline does


@pytest.fixture(scope="module")
def keras(tf: Any) -> Any:
    import keras

    keras.utils.set_random_seed(0)
    return keras


@pytest.fixture(scope="module")
def mlp_file(keras: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Keras MLP (4 features in, 3 class probabilities out) saved as a .keras file."""
    model = keras.Sequential([
        keras.Input((4,), name="features"),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(3, activation="softmax"),
    ])
    path = tmp_path_factory.mktemp("keras") / "mlp.keras"
    model.save(path)
    return path


def _save_two_input(tf: Any, folder: Path, *, unsupported: bool = False) -> Path:
    """A SavedModel whose serving_default takes `amount` [n, 3] and `history` [n, 5] and answers
    `logit` and `score`; with ``unsupported``, it also applies Dawson's integral, an operator
    tf2onnx cannot convert."""

    class Scorer(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal((3, 2), seed=(1, 2)))
            self.v = tf.Variable(tf.random.stateless_normal((5, 2), seed=(3, 4)))

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="amount"),
                                      tf.TensorSpec([None, 5], tf.float32, name="history")])
        def serve(self, amount: Any, history: Any) -> dict[str, Any]:
            if unsupported:
                amount = tf.math.special.dawsn(amount)
            logit = tf.matmul(amount, self.w) + tf.matmul(history, self.v)
            return {"logit": logit, "score": tf.sigmoid(logit)}

    scorer = Scorer()
    tf.saved_model.save(scorer, str(folder), signatures={"serving_default": scorer.serve})
    return folder


@pytest.fixture(scope="module")
def two_input(tf: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_two_input(tf, tmp_path_factory.mktemp("saved") / "scorer")


@pytest.fixture(scope="module")
def unsupported(tf: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_two_input(tf, tmp_path_factory.mktemp("saved") / "dawson", unsupported=True)


def _inputs(rows: int) -> dict[str, np.ndarray]:
    return {"amount": RNG.normal(size=(rows, 3)).astype(np.float32),
            "history": RNG.normal(size=(rows, 5)).astype(np.float32)}


def _run_onnx(data: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds),
                    strict=True))


def _tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


# --- conversion --------------------------------------------------------------------------------


def test_keras_file_converts_with_its_input_name(keras: Any, mlp_file: Path) -> None:
    assert detect_framework(mlp_file) == "keras" == detect_framework(str(mlp_file))
    converted = convert(mlp_file, RNG.normal(size=(16, 4)))
    assert (converted.framework, converted.framework_version) == ("keras", keras.__version__)
    assert converted.input_name == "features" and converted.output_names == ["output_0"]
    assert converted.n_features == 4 and converted.max_abs_diff < 1e-5
    rows = RNG.normal(size=(37, 4)).astype(np.float32)  # a batch size the sample never had
    expected = keras.saving.load_model(mlp_file)(rows).numpy()
    got = _run_onnx(converted.onnx_bytes, {"features": rows})["output_0"]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_keras_model_with_two_named_inputs_keeps_their_order(keras: Any) -> None:
    amount = keras.Input((3,), name="amount")
    history = keras.Input((5,), name="history")
    joined = keras.layers.Concatenate()([amount, history])
    model = keras.Model([amount, history], {"risk": keras.layers.Dense(1)(joined)})
    feeds = _inputs(12)
    converted = convert(model, feeds)  # the object itself converts too
    assert converted.framework == "keras" and converted.output_names == ["risk"]
    onx = onnx.load_from_string(converted.onnx_bytes)
    assert [i.name for i in onx.graph.input] == ["amount", "history"]
    expected = model([feeds["amount"], feeds["history"]])["risk"].numpy()
    np.testing.assert_allclose(_run_onnx(converted.onnx_bytes, feeds)["risk"], expected,
                               atol=1e-5)


def test_saved_model_converts_its_serving_signature(tf: Any, two_input: Path) -> None:
    assert is_saved_model(two_input) and detect_framework(two_input) == "tensorflow"
    converted = convert(two_input, _inputs(8))
    assert (converted.framework, converted.framework_version) == ("tensorflow", tf.__version__)
    assert converted.input_name == "amount" and converted.output_names == ["logit", "score"]
    feeds = _inputs(21)
    expected = tf.saved_model.load(str(two_input)).signatures["serving_default"](**feeds)
    got = _run_onnx(converted.onnx_bytes, feeds)
    for name in ("logit", "score"):
        np.testing.assert_allclose(got[name], expected[name].numpy(), atol=1e-5)


def test_unsupported_operator_is_refused_by_name(unsupported: Path) -> None:
    with pytest.raises(ConversionError, match=r"TensorFlow operator 'Dawsn' \(node 'dawsn/Dawsn'\)"
                       ) as caught:
        convert(unsupported, _inputs(4))
    assert caught.value.details["operators"] == ["Dawsn"]


def test_a_disagreement_with_the_original_is_refused(
        two_input: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tf_convert.reference_outputs

    def drifted(serving: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        answer = real(serving, feeds)
        answer["score"] = answer["score"] + 0.01
        return answer

    monkeypatch.setattr(tf_convert, "reference_outputs", drifted)
    with pytest.raises(ConversionError, match=r"'score' differs from the original by 0.01"):
        convert(two_input, _inputs(4))


def test_bad_samples_and_signatures_are_refused(tf: Any, two_input: Path,
                                                tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match=r"takes the inputs amount, history but the sample "
                                              r"has one array"):
        convert(two_input, np.zeros((4, 8), dtype=np.float32))
    with pytest.raises(ConversionError, match=r"sample has arrays amount, X.*arrays amount, "
                                              r"history"):
        convert(two_input, {"amount": np.zeros((4, 3)), "X": np.zeros((4, 5))})
    with pytest.raises(ConversionError, match=r"input 'history' has shape \(4, 4\).*\(any, 5\)"):
        convert(two_input, {"amount": np.zeros((4, 3)), "history": np.zeros((4, 4))})
    with pytest.raises(ConversionError, match=r"different numbers of rows"):
        convert(two_input, {"amount": np.zeros((4, 3)), "history": np.zeros((3, 5))})
    module = tf.Module()
    module.f = tf.function(lambda x: x + 1, input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "unsigned"), signatures={"score": module.f})
    with pytest.raises(ConversionError, match=r"no 'serving_default' signature \(it has score\)"):
        convert(tmp_path / "unsigned", np.zeros((2,)))
    with pytest.raises(ConversionError, match=r"a Keras \.keras file or a TensorFlow SavedModel"):
        convert(tmp_path / "missing.keras", np.zeros((2, 2)))


# --- the command line -------------------------------------------------------------------------


def test_models_add_a_saved_model_with_two_inputs_and_predict(
        tf: Any, two_input: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = ModelRepository(tmp_path / "models")
    sample = tmp_path / "inputs.npz"
    np.savez(sample, **_inputs(32))
    code, out, err = run_cli(["models", "add", "-m", "scorer", two_input, "--sample", sample,
                              "-r", repo.root], capsys)
    assert code == 0, err
    assert "added scorer version 1 (tensorflow" in out
    meta = repo.metadata("scorer", 1)
    assert [(i.name, i.shape) for i in meta.inputs] == [("amount", [-1, 3]), ("history", [-1, 5])]
    assert [o.name for o in meta.outputs] == ["logit", "score"]
    assert meta.framework == "tensorflow" and meta.extra["conversion_max_abs_diff"] < 1e-5
    row = {"amount": [[0.5, -1.0, 2.0]], "history": [[1.0, 0.0, -0.5, 0.25, 3.0]]}
    code, out, err = run_cli(["predict", "-m", "scorer", "-i", json.dumps(row), "-r", repo.root],
                             capsys)
    assert code == 0, err
    feeds = {k: np.asarray(v, dtype=np.float32) for k, v in row.items()}
    expected = tf.saved_model.load(str(two_input)).signatures["serving_default"](**feeds)
    answer = json.loads(out)["outputs"]
    np.testing.assert_allclose(answer["score"], expected["score"].numpy(), atol=1e-5)


def test_an_unsupported_saved_model_is_refused_and_loses_nothing(
        two_input: Path, unsupported: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo = ModelRepository(tmp_path / "models")
    sample = tmp_path / "inputs.npz"
    np.savez(sample, **_inputs(16))
    code, _, err = run_cli(["models", "add", "-m", "scorer", two_input, "--sample", sample,
                            "-r", repo.root], capsys)
    assert code == 0, err
    before = _tree_digest(unsupported)
    code, out, err = run_cli(["models", "add", "-m", "scorer", unsupported, "--sample", sample,
                              "-r", repo.root], capsys)
    assert code != 0 and out == ""
    assert "TensorFlow operator 'Dawsn'" in err and "Nothing was added" in err
    assert "Traceback" not in err
    assert repo.versions("scorer") == [1]
    repo.verify("scorer", 1)  # the version there is whole and untouched
    assert not [p for p in (repo.root / "scorer").iterdir() if p.name.startswith(".tmp-")]
    assert _tree_digest(unsupported) == before  # the user's folder too


def test_models_add_a_keras_file_needs_a_sample(mlp_file: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["models", "add", "-m", "mlp", mlp_file, "-r", tmp_path / "m"], capsys)
    assert code != 0 and "needs --sample for the parity check" in err


@pytest.mark.slow
def test_optimize_and_gate_work_on_a_model_added_from_keras(
        keras: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    model = keras.Sequential([keras.Input((64,), name="pixels"),
                              keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    model.fit(x[:1000], y[:1000], epochs=3, batch_size=32, verbose=0)  # ~0.9 accuracy
    model.save(tmp_path / "digits.keras")
    np.savez(tmp_path / "train.npz", X=x[:1000], y=y[:1000])
    np.savez(tmp_path / "val.npz", X=x[1000:], y=y[1000:])
    repo = tmp_path / "models"

    code, out, err = run_cli(["models", "add", "-m", "digits", tmp_path / "digits.keras",
                              "--sample", tmp_path / "train.npz", "--labels",
                              ",".join(map(str, range(10))), "-r", repo], capsys)
    assert code == 0, err
    meta = ModelRepository(repo).metadata("digits", 1)
    assert meta.framework == "keras" and meta.task == "classification"
    assert meta.input_profile["rows"] == 1000  # the drift profile of the sample

    report = tmp_path / "optimize.json"
    code, out, err = run_cli(["optimize", "digits", "--data", tmp_path / "val.npz", "-r", repo,
                              "--techniques", "quantize", "--tolerance", "0.05",
                              "--guard-tolerance", "0.5", "--min-speedup", "0", "--fast",
                              "--rounds", "40", "--passes", "2", "--max-seconds", "5",
                              "--json-out", report],
                             capsys)
    assert code == 0, err
    chosen = json.loads(report.read_text())
    assert chosen["chosen"] and chosen["registered"]["version"] == 2, chosen["reason"]
    original = next(c for c in chosen["candidates"] if c["name"] == "original")
    assert original["metrics"]["accuracy"] > 0.8  # the Keras model, measured through ONNX

    code, _, err = run_cli(["models", "promote", "-m", "digits", "--version", "1", "-r", repo],
                           capsys)
    assert code == 0, err
    code, out, err = run_cli(["gate", "--model", "digits", "--candidate", "2", "--data",
                              tmp_path / "val.npz", "-r", repo, "--max-accuracy-drop", "0.05",
                              "--max-disagreement", "0.2", "--max-slowdown", "3",
                              "--rounds", "100", "--passes", "2"], capsys)
    assert code == 0, err
    assert "gate PASSED: digits v2 against production (v1)" in out
