"""`redline models add --from-mlflow`: real models logged with MLflow to stores on local disk (a
SQLite store with a registered model, and a file store), added through the real CLI, and the
served answers compared with MLflow's own predictions on the input example."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.models.cli import run as cli

pytestmark = pytest.mark.slow  # MLflow's SQLite store takes seconds to create
mlflow = pytest.importorskip("mlflow")
pd = pytest.importorskip("pandas")

COLUMNS = ["amount", "age", "score"]


@pytest.fixture(scope="module", autouse=True)
def _uris_stay_in_this_module() -> Iterator[None]:
    """``mlflow.set_tracking_uri``/``set_registry_uri`` also set ``MLFLOW_TRACKING_URI`` and
    ``MLFLOW_REGISTRY_URI`` in ``os.environ``, for child processes: they are put back after this
    module, or the children of a later test on this worker register into its store (the
    ``mlflow.sklearn.log_model`` of docs/models.md did, and the page's own store stayed empty)."""
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _rows(n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).random((n, 3)).astype(np.float32)
    return x, (x[:, 0] + 0.3 * x[:, 1] > 0.6).astype(np.int64)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A SQLite tracking store holding one run with every flavor, plus a registered model."""
    import lightgbm as lgb
    import torch
    import xgboost as xgb
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.tree import DecisionTreeClassifier

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    x, y = _rows()
    frame = pd.DataFrame(x, columns=COLUMNS)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    class Doubler(mlflow.pyfunc.PythonModel):  # pickled by value: defined in a function
        def predict(self, context: Any, model_input: Any, params: Any = None) -> Any:
            return (model_input["amount"] * 2 + model_input["age"]).to_numpy()

    class RowSum(mlflow.pyfunc.PythonModel):
        def predict(self, context: Any, model_input: Any, params: Any = None) -> Any:
            return np.asarray(model_input).sum(axis=1)

    from skl2onnx import to_onnx

    onnx_model = to_onnx(LogisticRegression().fit(x, y), x[:1], options={"zipmap": False})

    log = {"pip_requirements": [], "input_example": x[:5]}  # no requirement inference: fast
    experiment = mlflow.create_experiment("redline", artifact_location=(root / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.sklearn.log_model(LogisticRegression().fit(frame, y), name="sk",
                                 pip_requirements=[], input_example=frame.iloc[:5],
                                 registered_model_name="fraud")
        mlflow.lightgbm.log_model(lgb.LGBMClassifier(n_estimators=5, min_child_samples=2,
                                                     verbose=-1).fit(x, y), name="lgb", **log)
        mlflow.xgboost.log_model(xgb.XGBRegressor(n_estimators=5, max_depth=2).fit(x, x[:, 1]),
                                 name="xgb", **log)
        mlflow.xgboost.log_model(xgb.train({"objective": "binary:logistic", "max_depth": 2},
                                           xgb.DMatrix(x, y), 5), name="booster", **log)
        mlflow.lightgbm.log_model(lgb.train({"objective": "regression", "min_data_in_leaf": 2,
                                             "verbose": -1}, lgb.Dataset(x, x[:, 0]), 5),
                                  name="lgb_booster", **log)
        onnx_info = mlflow.onnx.log_model(onnx_model, name="onnx", **log)
        mlflow.pytorch.log_model(net, name="torch", **log)
        mlflow.pytorch.log_model(net, name="torch_pickle", serialization_format="pickle", **log)
        mlflow.sklearn.log_model(LogisticRegression().fit(x, y), name="sk_pickle",
                                 serialization_format="cloudpickle", **log)
        mlflow.sklearn.log_model(LinearRegression().fit(x, x[:, 2]), name="bare",
                                 pip_requirements=[])
        mlflow.sklearn.log_model(DecisionTreeClassifier(max_depth=2).fit(x, y), name="tree",
                                 skops_trusted_types=["sklearn.tree._tree.Tree"], **log)
        mlflow.pyfunc.log_model(name="pyfunc", python_model=Doubler(), pip_requirements=[],
                                input_example=frame.iloc[:5])
        mlflow.pyfunc.log_model(name="rowsum", python_model=RowSum(), pip_requirements=[],
                                signature=False)
    mlflow.MlflowClient().set_registered_model_alias("fraud", "champion", "1")
    return {"uri": uri, "run": run.info.run_id, "x": x, "frame": frame, "root": root,
            "onnx_id": onnx_info.model_id}


@pytest.fixture(scope="module")
def file_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A file (folder) tracking store with one scikit-learn regressor."""
    from sklearn.linear_model import Ridge

    root = tmp_path_factory.mktemp("mlruns")
    previous = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow keeps the folder store for reading
    try:
        mlflow.set_tracking_uri(root.as_uri())
        x, _ = _rows()
        with mlflow.start_run(experiment_id=mlflow.create_experiment("redline")) as run:
            info = mlflow.sklearn.log_model(
                Ridge().fit(x, x[:, 0] * 10), name="model",
                pip_requirements=[], input_example=x[:5])
        folder = Path(mlflow.artifacts.download_artifacts(info.model_uri,
                                                          dst_path=str(root / "copy")))
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = previous
    return {"uri": root.as_uri(), "run": run.info.run_id, "x": x, "folder": folder}


def add(capsys: pytest.CaptureFixture[str], repo: Path, name: str, uri: str, store: str | None,
        *more: str) -> tuple[int, str, str]:
    extra = ("--tracking-uri", store) if store else ()
    return cli(capsys, "models", "add", "-m", name, "--from-mlflow", uri, "-r", str(repo),
               *extra, *more)


def served(repo: Path, name: str, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    from redline.models import ModelRepository, load_runner

    runner = load_runner(ModelRepository(repo), name)
    try:
        return runner.run(runner.validate(inputs))
    finally:
        runner.close()


def mlflow_predicts(uri: str, store: str, example: Any, output: str = "") -> np.ndarray:
    mlflow.set_tracking_uri(store)
    mlflow.set_registry_uri(store)
    answer = mlflow.pyfunc.load_model(uri).predict(example)
    return np.asarray(answer[output] if isinstance(answer, dict) else answer)


@pytest.mark.parametrize(("path", "flavor", "framework", "output"), [
    ("sk", "sklearn", "scikit-learn", "label"),
    ("lgb", "lightgbm", "lightgbm", "label"),
    ("xgb", "xgboost", "xgboost", "variable"),
    ("booster", "xgboost", "xgboost", "probabilities"),
    ("lgb_booster", "lightgbm", "lightgbm", "variable"),
    ("onnx", "onnx", "onnx", "probabilities"),
    ("torch", "pytorch", "pytorch", "output"),
])
def test_flavors_convert_to_onnx_that_answers_as_mlflow(
        capsys, tmp_path, store, path: str, flavor: str, framework: str, output: str) -> None:
    uri = f"runs:/{store['run']}/{path}"
    code, out, err = add(capsys, tmp_path, path, uri, store["uri"])
    assert code == 0, err
    assert f"added {path} version 1 ({framework}" in out
    from redline.models import ModelRepository

    meta = ModelRepository(tmp_path).metadata(path)
    example = store["frame"].iloc[:5] if path == "sk" else store["x"][:5]
    assert meta.inputs[0].shape == [-1, 3]
    assert meta.feature_names == (COLUMNS if path == "sk" else None)  # the signature's columns
    assert meta.extra["mlflow"]["flavor"] == flavor
    assert meta.extra["mlflow"]["run_id"] == store["run"]
    assert path == "onnx" or meta.extra["mlflow"]["signature"]["inputs"]  # MLflow infers none
    got = served(tmp_path, path, {meta.inputs[0].name: store["x"][:5]})[output]
    want = mlflow_predicts(uri, store["uri"], example, output)
    if path == "booster":  # a binary Booster answers the positive class's probability
        got = got[:, 1]
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


def test_registered_model_by_version_and_alias(capsys, tmp_path, store) -> None:
    for uri in ("models:/fraud/1", "models:/fraud@champion"):
        code, out, err = add(capsys, tmp_path, "fraud", uri, store["uri"])
        assert code == 0, err
    code, out, err = add(capsys, tmp_path, "by_id", f"models:/{store['onnx_id']}", store["uri"])
    assert code == 0, err
    from redline.models import ModelRepository

    repo = ModelRepository(tmp_path)
    assert repo.versions("fraud") == [1, 2]
    assert repo.metadata("fraud", 2).extra["mlflow"]["uri"] == "models:/fraud@champion"
    got = served(tmp_path, "fraud", {"input": store["x"][:5]})["label"]
    np.testing.assert_array_equal(
        got, mlflow_predicts("models:/fraud/1", store["uri"], store["frame"].iloc[:5]))


def test_file_store_and_model_folder(capsys, tmp_path, file_store) -> None:
    uri = f"runs:/{file_store['run']}/model"
    assert add(capsys, tmp_path, "tree", uri, file_store["uri"])[0] == 0
    code, _, err = add(capsys, tmp_path, "tree", str(file_store["folder"]), None)
    assert code == 0, err
    want = np.asarray(mlflow.pyfunc.load_model(str(file_store["folder"])).predict(
        file_store["x"][:5]))
    for version in ("1", "2"):
        from redline.models import ModelRepository, load_runner

        runner = load_runner(ModelRepository(tmp_path), "tree", version)
        got = runner.run(runner.validate({"input": file_store["x"][:5]}))["variable"]
        np.testing.assert_allclose(got.ravel(), want, rtol=1e-5)


def test_pyfunc_becomes_a_python_model(capsys, tmp_path, store) -> None:
    uri = f"runs:/{store['run']}/pyfunc"
    code, _, err = add(capsys, tmp_path, "doubler", uri, store["uri"])
    assert code != 0 and "--flavor pyfunc --trust-code" in err and "Traceback" not in err
    code, _, err = add(capsys, tmp_path, "doubler", uri, store["uri"], "--flavor", "pyfunc")
    assert code != 0 and "pass --trust-code" in err
    code, out, err = add(capsys, tmp_path, "doubler", uri, store["uri"], "--flavor", "pyfunc",
                         "--trust-code")
    assert code == 0, err
    assert "(python," in out
    from redline.models import ModelRepository

    meta = ModelRepository(tmp_path).metadata("doubler")
    assert meta.feature_names == COLUMNS
    assert [(s.name, s.datatype, s.shape) for s in meta.inputs] == [("input", "FP32", [-1, 3])]
    got = served(tmp_path, "doubler", {"input": store["x"][:5]})
    want = mlflow_predicts(uri, store["uri"], store["frame"].iloc[:5])
    assert list(got) == [o.name for o in meta.outputs]
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-6)


def test_pyfunc_without_signature_reads_the_sample(capsys, tmp_path, store) -> None:
    """No signature, no example: the sample gives the input, one run of the model the output."""
    uri = f"runs:/{store['run']}/rowsum"
    np.save(tmp_path / "rows.npy", store["x"][:8])
    code, _, err = add(capsys, tmp_path, "rowsum", uri, store["uri"], "--flavor", "pyfunc",
                       "--trust-code")
    assert code != 0 and "pass --sample ROWS" in err
    code, out, err = add(capsys, tmp_path, "rowsum", uri, store["uri"], "--flavor", "pyfunc",
                         "--trust-code", "--sample", str(tmp_path / "rows.npy"))
    assert code == 0, err
    got = served(tmp_path, "rowsum", {"input": store["x"][:3]})
    np.testing.assert_allclose(got["output"], store["x"][:3].sum(axis=1), rtol=1e-6)


def test_pickles_need_trust(capsys, tmp_path, store) -> None:
    for path, stored in (("torch_pickle", "a pickle"), ("sk_pickle", "a cloudpickle file"),
                         ("tree", "a skops file that trusts sklearn.tree._tree.Tree")):
        uri = f"runs:/{store['run']}/{path}"
        code, _, err = add(capsys, tmp_path, path, uri, store["uri"])
        assert code != 0 and stored in err and "--trust-pickle" in err, err
        code, out, err = add(capsys, tmp_path, path, uri, store["uri"], "--trust-pickle")
        assert code == 0, err


def test_no_example_asks_for_a_sample(capsys, tmp_path, store) -> None:
    uri = f"runs:/{store['run']}/bare"
    code, _, err = add(capsys, tmp_path, "bare", uri, store["uri"])
    assert code != 0 and "without a signature or an input example" in err
    assert "--sample" in err
    np.save(tmp_path / "rows.npy", store["x"][:20])
    code, out, err = add(capsys, tmp_path, "bare", uri, store["uri"], "--sample",
                         str(tmp_path / "rows.npy"))
    assert code == 0, err
    np.save(tmp_path / "wide.npy", np.hstack([store["x"][:20], store["x"][:20]]))
    code, _, err = add(capsys, tmp_path, "sk", f"runs:/{store['run']}/sk", store["uri"],
                       "--sample", str(tmp_path / "wide.npy"))
    assert code != 0 and "takes 3 inputs per row (amount, age, score)" in err, err


@pytest.mark.parametrize(("uri", "said"), [
    ("s3://bucket/model", "unknown URI scheme 's3:'"),
    ("runs:/{run}/nothing", "has no model at 'nothing' (its logged models: bare, booster,"),
    ("runs:/0123456789abcdef/sk", "no run 0123456789abcdef"),
    ("models:/nobody/1", "(registered models: fraud)"),
    ("models:/fraud/7", "versions of 'fraud': 1"),
    ("{root}", "no MLmodel file"),
])
def test_bad_uris_say_what_to_do(capsys, tmp_path, store, uri: str, said: str) -> None:
    uri = uri.format(run=store["run"], root=store["root"])
    code, _, err = add(capsys, tmp_path, "m", uri, store["uri"])
    assert code != 0 and said in err and "Traceback" not in err, err


def test_tracking_store_must_exist_locally(capsys, tmp_path, store) -> None:
    code, _, err = add(capsys, tmp_path, "m", "models:/fraud/1",
                       f"sqlite:///{tmp_path / 'none.db'}")
    assert code != 0 and "does not exist" in err
    assert not (tmp_path / "none.db").exists()  # MLflow was not let create an empty store
    code, _, err = add(capsys, tmp_path, "m", "models:/fraud/1", "http://localhost:5000")
    assert code != 0 and "local stores only" in err and "mlflow artifacts download" in err


def test_unconvertible_flavor_names_it(capsys, tmp_path, store) -> None:
    """A flavor redline cannot convert is named, with the pyfunc way out."""
    import yaml

    folder = tmp_path / "keras_model"
    mlflow.set_tracking_uri(store["uri"])
    mlflow.set_registry_uri(store["uri"])
    shutil.copytree(mlflow.artifacts.download_artifacts(f"runs:/{store['run']}/pyfunc"), folder)
    spec = yaml.safe_load((folder / "MLmodel").read_text())
    spec["flavors"]["keras"] = {"keras_version": "3.10.0", "data": "data"}
    (folder / "MLmodel").write_text(yaml.safe_dump(spec))
    code, _, err = add(capsys, tmp_path, "m", str(folder), None)
    assert code != 0 and "the keras flavor" in err and "--flavor pyfunc --trust-code" in err
