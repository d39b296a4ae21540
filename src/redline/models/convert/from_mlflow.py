"""MLflow models into the repository: a logged model folder, ``runs:/…`` or ``models:/…``.

The scikit-learn, LightGBM, XGBoost and PyTorch flavors are loaded and converted to ONNX with
the usual parity check, run on the model's input example (or ``--sample``); an ``onnx`` flavor is
taken as it is; ``pyfunc`` becomes a Python model. Feature names come from the MLflow signature.

Only local tracking stores are read (a ``file:`` folder or a ``sqlite:///`` file): MLflow is asked
to create nothing, and what it downloads lands in a temporary folder that is removed afterwards.
Loading runs no code from the model unless the caller trusts it: native formats (XGBoost, a
LightGBM Booster, PyTorch's ``pt2``) and skops files whose types are known load as they are; a
pickle needs ``trust_pickle``, a pyfunc ``trust_code``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import numpy as np

from redline.errors import ConversionError, InvalidInput, ModelNotFound, RedlineError
from redline.models.convert.frameworks import import_framework

if TYPE_CHECKING:
    from redline.models.metadata import ModelMetadata
    from redline.models.repository import ModelRepository

CONVERTIBLE = ("sklearn", "lightgbm", "xgboost", "pytorch", "onnx")  # picked in this order
FLAVORS = (*CONVERTIBLE, "pyfunc")
PYFUNC = "python_function"
# skops types that construct nothing but the estimators they name: MLflow writes this list for a
# LightGBM sklearn-API model; scikit-learn's own types are trusted by skops itself.
_SAFE_SKOPS_TYPES = frozenset({
    "collections.OrderedDict",
    "lightgbm.basic.Booster",
    "lightgbm.sklearn.LGBMClassifier",
    "lightgbm.sklearn.LGBMRegressor",
    "lightgbm.sklearn.LGBMRanker",
})
_NUMERIC_COLUMNS = ("boolean", "integer", "long", "float", "double")
_XGB_CLASSIFIERS = ("binary:logistic", "multi:softprob")
_USAGE = "redline models add -m NAME --from-mlflow URI"
_PYFUNC_HINT = "import its pyfunc flavor as a Python model instead: --flavor pyfunc --trust-code"


@dataclass
class MlflowModel:
    """A logged MLflow model copied to local disk: its MLmodel file, signature and example."""

    uri: str
    folder: Path
    flavors: dict[str, dict[str, Any]]
    signature: Any  # mlflow.models.ModelSignature, or None
    input_example: Any  # DataFrame, ndarray, dict..., or None
    info: dict[str, Any] = field(default_factory=dict)  # provenance for metadata.json


# ------------------------------------------------------------------------------------- entry
def add_from_mlflow(
    repo: ModelRepository,
    name: str,
    uri: str,
    *,
    tracking_uri: str | None = None,
    flavor: str | None = None,
    sample: Any = None,
    trust_pickle: bool = False,
    trust_code: bool = False,
    tolerance: float = 1e-4,
    feature_names: list[str] | None = None,
    runtime: str | None = None,
    timeout_s: float = 60.0,
    **kwargs: Any,
) -> ModelMetadata:
    """Add the MLflow model at ``uri`` as a new version of ``name``.

    ``flavor`` picks one (default: the first convertible one the model has); ``sample`` replaces
    the input example for the parity check and the drift profile; ``feature_names`` the names
    the signature gives. ``runtime`` and ``timeout_s`` apply to a pyfunc (a Python model).
    ``kwargs`` go on to ``ModelRepository.add_estimator``/``add_onnx``/``add_python``
    (``version``, ``description``, ``task``, ``class_labels``, ``missing_values``).
    """
    import_framework("mlflow", "mlflow")
    with tempfile.TemporaryDirectory(prefix="redline-mlflow-") as tmp:
        model = open_model(uri, tracking_uri, Path(tmp))
        chosen = choose_flavor(model, flavor)
        model.info["flavor"] = chosen
        model.info["sample"] = "input example" if sample is None else "--sample"
        extra = {**dict(kwargs.pop("extra", None) or {}), "mlflow": model.info}
        if chosen == "pyfunc":
            return add_pyfunc(repo, name, model, sample, Path(tmp), trust_code=trust_code,
                              feature_names=feature_names, runtime=runtime,
                              timeout_s=timeout_s, extra=extra, **kwargs)
        x, names = parity_sample(model, sample, chosen)
        names = feature_names or names
        if chosen == "onnx":
            data = (model.folder / model.flavors["onnx"]["data"]).read_bytes()
            return repo.add_onnx(name, data, feature_names=names, sample=x, framework="onnx",
                                 extra=extra, **kwargs)
        native = load_native(model, chosen, trust_pickle)
        with warnings.catch_warnings():
            # an exported PyTorch program checks its batch size; the trace keeps it dynamic
            warnings.filterwarnings("ignore", message="Converting a tensor to a Python boolean")
            # the parity check feeds rows; a model fitted on a DataFrame notes the missing names
            warnings.filterwarnings("ignore", message="X does not have valid feature names")
            try:
                return repo.add_estimator(name, native, x, tolerance=tolerance,
                                          feature_names=names, extra=extra, **kwargs)
            except ConversionError as exc:
                if "tolerance" in exc.details:  # a parity refusal says what to do already
                    raise
                raise ConversionError(f"{exc.message} (the {chosen} flavor of {uri}); or "
                                      f"{_PYFUNC_HINT}", **exc.details) from exc


# ------------------------------------------------------------------------------ locating it
def open_model(uri: str, tracking_uri: str | None, tmp: Path) -> MlflowModel:
    """Copy the model at ``uri`` into ``tmp`` and read its MLmodel file, signature and example."""
    mlflow = import_framework("mlflow", "mlflow")
    scheme = urlparse(uri).scheme
    store: str | None = None
    if scheme in ("runs", "models"):
        store = tracking_store(tracking_uri)
        source = uri
    elif scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        folder = Path(unquote(urlparse(uri).path) if scheme == "file" else uri).expanduser()
        source = str(model_folder(folder))
    else:
        raise InvalidInput(
            f"--from-mlflow {uri}: unknown URI scheme '{scheme}:'. Pass a logged model folder, "
            "runs:/RUN_ID/PATH or models:/NAME/VERSION against a local tracking store; for a "
            "model on a tracking server, download it first (`mlflow artifacts download -u URI "
            "-d DIR`) and pass the folder")
    with mlflow_scope(store):
        local = Path(download(mlflow, source, uri, store, tmp / "model"))
        if not (local / "MLmodel").is_file():
            raise InvalidInput(f"--from-mlflow {uri} is not an MLflow model: it has no MLmodel "
                               f"file{_nested_models_hint(local)}")
        try:
            meta = mlflow.models.Model.load(str(local))
            example = meta.load_input_example(str(local))
        except Exception as exc:
            raise InvalidInput(f"--from-mlflow {uri}: its MLmodel file or input example cannot "
                               f"be read ({_first_line(exc)})") from exc
    info = {"uri": uri, "tracking_uri": store, "run_id": meta.run_id,
            "model_id": getattr(meta, "model_id", None), "mlflow_version": meta.mlflow_version,
            "signature": meta.signature.to_dict() if meta.signature is not None else None}
    return MlflowModel(uri, local, dict(meta.flavors), meta.signature, example,
                       {k: v for k, v in info.items() if v is not None})


def tracking_store(tracking_uri: str | None) -> str:
    """The local tracking store to read, as a URI MLflow accepts.

    ``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else where MLflow looks by default
    (``./mlruns`` when it holds experiments, else ``./mlflow.db``). Refused unless it exists on
    local disk, so that MLflow never creates an empty store in its place."""
    given = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not given:  # as MLflow chooses: ./mlruns when it holds experiments, else ./mlflow.db
        if any(Path("mlruns").glob("[0-9]*/meta.yaml")):
            given = "mlruns"
        elif Path("mlflow.db").is_file():
            given = "mlflow.db"
        else:
            raise InvalidInput(
                "runs:/ and models:/ URIs are read from a tracking store, and none was found "
                "here (no ./mlruns, no ./mlflow.db): pass --tracking-uri sqlite:///PATH/mlflow.db "
                "or --tracking-uri PATH/mlruns (or set MLFLOW_TRACKING_URI)")
    parsed = urlparse(given)
    if parsed.scheme == "sqlite":
        path = Path(given[len("sqlite:///"):])
    elif parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path) if parsed.scheme == "file" else given).expanduser()
    else:
        raise InvalidInput(
            f"tracking store {given}: redline reads local stores only, a folder (file:) or a "
            "SQLite file (sqlite:///); for a tracking server, download the model first "
            "(`mlflow artifacts download -u URI -d DIR`) and pass the folder to --from-mlflow")
    if not path.exists():
        raise InvalidInput(f"tracking store {given}: {path} does not exist; pass the folder or "
                           "SQLite file the models were logged to (--tracking-uri)")
    if path.is_dir():
        return path.resolve().as_uri()
    return f"sqlite:///{path.resolve()}"


def model_folder(folder: Path) -> Path:
    if not folder.is_dir():
        raise InvalidInput(f"--from-mlflow {folder}: no such folder; pass the folder of a logged "
                           "model (it holds an MLmodel file), runs:/RUN_ID/PATH or "
                           "models:/NAME/VERSION")
    if not (folder / "MLmodel").is_file():
        raise InvalidInput(f"--from-mlflow {folder} is not an MLflow model folder: it has no "
                           f"MLmodel file{_nested_models_hint(folder)}")
    return folder.resolve()


def _nested_models_hint(folder: Path) -> str:
    found = sorted(str(p.parent) for p in folder.glob("*/MLmodel"))[:3]
    return f" (models below it: {', '.join(found)})" if found else ""


def download(mlflow: Any, source: str, uri: str, store: str | None, dst: Path) -> str:
    """The model's files copied to ``dst``; a clear error when the run, artifact or version is
    missing. A local folder is copied too: MLflow loads nothing from the caller's folders."""
    if store is None:
        shutil.copytree(source, dst)
        return str(dst)
    dst.mkdir()
    try:
        return str(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(dst)))
    except ImportError as exc:  # a SQLite store needs SQLAlchemy, which MLflow's client lacks
        raise ConversionError(f"reading tracking store {store} needs the '{exc.name}' "
                              "package: pip install 'redline[mlflow]'") from exc
    except Exception as exc:
        raise ModelNotFound(_missing(mlflow, uri, store, exc)) from exc


def _missing(mlflow: Any, uri: str, store: str, exc: Exception) -> str:
    """What is missing behind ``uri``, with what exists instead."""
    said = _first_line(exc)
    parsed = urlparse(uri)
    if parsed.scheme == "runs":
        run_id, _, path = (parsed.netloc + parsed.path).strip("/").partition("/")
        if "not found" in said.lower() and run_id in said:
            return f"--from-mlflow {uri}: no run {run_id} in tracking store {store}"
        names = _run_models(mlflow, run_id)
        where = (f"its logged models: {', '.join(names)}" if names
                 else "it logged no models")
        return (f"--from-mlflow {uri}: run {run_id} has no model at '{path or '(nothing)'}' "
                f"({where}); pass runs:/{run_id}/NAME")
    name = parsed.netloc or parsed.path.strip("/").split("/")[0]
    name = name.split("@")[0]
    registered = _registered(mlflow)
    if name not in registered:
        known = ", ".join(sorted(registered)) or "none"
        return (f"--from-mlflow {uri}: no registered model '{name}' in tracking store {store} "
                f"(registered models: {known})")
    versions = ", ".join(map(str, registered[name])) or "none"
    return (f"--from-mlflow {uri}: {said} (versions of '{name}': {versions}; an alias such as "
            f"models:/{name}@champion works too)")


def _registered(mlflow: Any) -> dict[str, list[str]]:
    """Registered model names and their versions, or nothing if the registry cannot be read."""
    with contextlib.suppress(Exception):
        client = mlflow.tracking.MlflowClient()
        return {m.name: sorted((v.version for v in client.search_model_versions(
            f"name = '{m.name}'")), key=int) for m in client.search_registered_models()}
    return {}


def _run_models(mlflow: Any, run_id: str) -> list[str]:
    with contextlib.suppress(Exception):
        client = mlflow.tracking.MlflowClient()
        run = client.get_run(run_id)
        models = client.search_logged_models(experiment_ids=[run.info.experiment_id])
        return sorted({m.name for m in models if m.source_run_id == run_id})
    return []


@contextlib.contextmanager
def mlflow_scope(store: str | None, *, allow_code: bool = False) -> Iterator[None]:
    """MLflow pointed at ``store`` (tracking and registry), quiet below errors, allowed to run a
    model's code only when ``allow_code``; everything as it was afterwards."""
    import mlflow
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service import utils as tracking

    env = {
        "MLFLOW_ALLOW_MODEL_CODE_EXECUTION": "true" if allow_code else "false",
        "MLFLOW_ALLOW_FILE_STORE": "true",  # reading a file store MLflow no longer writes to
    }
    deprecated = "MLFLOW_ALLOW_PICKLE_DESERIALIZATION"  # would overrule the one above
    saved_env = {k: os.environ.get(k) for k in (*env, deprecated, "MLFLOW_TRACKING_URI",
                                                 "MLFLOW_REGISTRY_URI")}
    os.environ.pop(deprecated, None)
    saved_uris = (getattr(tracking, "_tracking_uri", None),
                  getattr(registry, "_registry_uri", None))
    logger = logging.getLogger("mlflow")
    level = logger.level
    os.environ.update(env)
    logger.setLevel(logging.ERROR)
    if store is not None:
        mlflow.set_tracking_uri(store)
        mlflow.set_registry_uri(store)
    try:
        yield
    finally:
        if store is not None:
            tracking.set_tracking_uri(saved_uris[0])  # type: ignore[arg-type]  # None: unset
            registry._registry_uri = saved_uris[1]
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        logger.setLevel(level)


# ------------------------------------------------------------------------- what to import
def choose_flavor(model: MlflowModel, requested: str | None) -> str:
    """The flavor to import: ``requested``, else the first convertible one the model has."""
    have = [("pyfunc" if f == PYFUNC else f) for f in model.flavors]
    if requested is not None:
        wanted = "pyfunc" if requested == PYFUNC else requested
        if wanted not in have:
            raise InvalidInput(f"--from-mlflow {model.uri} has no {wanted} flavor (it has "
                               f"{', '.join(have)})")
        return wanted
    for candidate in CONVERTIBLE:
        if candidate in have:
            return candidate
    others = [f for f in have if f != "pyfunc"]
    what = f"the {', '.join(others)} flavor" if others else "only the pyfunc flavor"
    hint = (_PYFUNC_HINT if "pyfunc" in have
            else "log it with one of those flavors or as an ONNX model")
    raise ConversionError(
        f"--from-mlflow {model.uri} has {what}, which redline cannot convert to ONNX (it "
        f"converts {', '.join(CONVERTIBLE[:-1])} and takes onnx as it is); {hint}")


def parity_sample(model: MlflowModel, sample: Any, flavor: str
                  ) -> tuple[np.ndarray, list[str] | None]:
    """The rows the conversion is checked on (``sample``, else the input example) as float32,
    and the feature names the signature gives them."""
    names, width = signature_columns(model, flavor)
    if sample is None:
        if model.input_example is None:
            missing = "an input example" if model.signature is not None else (
                "a signature or an input example")
            raise InvalidInput(
                f"--from-mlflow {model.uri} was logged without {missing}, so there are no rows "
                "to check the conversion on: pass --sample ROWS (.npz, .npy, .csv or .parquet "
                "with representative inputs), or log the model with input_example=")
        rows = example_rows(model, names)
    else:
        rows = sample
    try:
        x = np.ascontiguousarray(np.asarray(rows, dtype=np.float32))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"--from-mlflow {model.uri}: the {_sample_word(sample)} cannot be "
                           f"read as numbers ({exc}); pass --sample ROWS") from exc
    if x.ndim == 1 and flavor != "pytorch":
        x = x.reshape(1, -1)
    if width is not None and (x.ndim < 2 or x.shape[1] != width):
        raise InvalidInput(
            f"--from-mlflow {model.uri}: the {_sample_word(sample)} has shape {x.shape} but the "
            f"MLflow signature takes {width} inputs per row"
            + (f" ({', '.join(names)})" if names else ""))
    return x, names


def _sample_word(sample: Any) -> str:
    return "input example" if sample is None else "--sample"


def signature_columns(model: MlflowModel, flavor: str) -> tuple[list[str] | None, int | None]:
    """Feature names and row width from the signature (``None`` where it does not say); a clear
    error for inputs that are no matrix of numbers."""
    signature = model.signature
    if signature is None or signature.inputs is None:
        return None, None
    schema = signature.inputs
    if schema.is_tensor_spec():
        specs = schema.inputs
        if len(specs) != 1:
            raise ConversionError(
                f"--from-mlflow {model.uri} takes {len(specs)} tensors "
                f"({', '.join(str(s.name) for s in specs)}); redline converts models with one "
                f"input; {_PYFUNC_HINT}")
        spec = specs[0]
        if spec.type.kind not in "biuf":
            raise ConversionError(f"--from-mlflow {model.uri} takes {spec.type} tensors, not "
                                  f"numbers; {_PYFUNC_HINT}")
        shape = list(spec.shape)
        if flavor != "pytorch" and len(shape) != 2:
            raise ConversionError(f"--from-mlflow {model.uri} takes tensors of shape {shape}; "
                                  f"a {flavor} model takes rows [batch, features]")
        return None, (shape[1] if len(shape) >= 2 and shape[1] > 0 else None)
    names, bad = [], []
    for col in schema.inputs:
        kind = getattr(col.type, "name", str(col.type))
        names.append(str(col.name))
        if kind not in _NUMERIC_COLUMNS:
            bad.append(f"{col.name} ({kind})")
    if bad:
        raise ConversionError(
            f"--from-mlflow {model.uri} takes columns that are not numbers: {', '.join(bad)}; "
            f"an ONNX conversion takes a matrix of numbers; {_PYFUNC_HINT}")
    if not schema.has_input_names():
        return None, len(names)
    return names, len(names)


def example_rows(model: MlflowModel, names: list[str] | None) -> Any:
    """The input example as rows in signature order."""
    example = model.input_example
    if hasattr(example, "columns"):  # a DataFrame: columns by name, in the signature's order
        if names:
            missing = [n for n in names if n not in example.columns]
            if missing:
                raise InvalidInput(f"--from-mlflow {model.uri}: the input example lacks the "
                                   f"signature's columns {missing}; pass --sample ROWS")
            example = example[names]
        return example.to_numpy()
    if isinstance(example, dict):
        if len(example) != 1:
            raise ConversionError(
                f"--from-mlflow {model.uri}: its input example has several inputs "
                f"({', '.join(map(str, example))}); redline converts models with one input; "
                f"{_PYFUNC_HINT}")
        return next(iter(example.values()))
    return example


# --------------------------------------------------------------------------- loading it
def load_native(model: MlflowModel, flavor: str, trust_pickle: bool) -> Any:
    """The framework object behind ``flavor``: a scikit-learn estimator, a LightGBM or XGBoost
    model, or a PyTorch module. A format that can run code needs ``trust_pickle``."""
    conf = model.flavors[flavor]
    risk = pickle_risk(flavor, conf, model.folder)
    if risk is not None and not trust_pickle:
        raise ConversionError(
            f"--from-mlflow {model.uri}: its {flavor} flavor is stored as {risk}: loading it "
            "can run code the file holds. Only import models you produced yourself; pass "
            "--trust-pickle to import it anyway (redline never loads it at serving time)")
    skops_file = _skops_file(flavor, conf)
    try:
        if skops_file is not None and risk is None:
            import_framework("skops", "mlflow")
            import skops.io

            types = conf.get("skops_trusted_types") or None
            native = skops.io.load(str(model.folder / skops_file), trusted=types)
        else:
            module = import_framework(f"mlflow.{flavor}", "mlflow")
            with mlflow_scope(None, allow_code=trust_pickle):
                native = module.load_model(str(model.folder))
    except ConversionError:
        raise
    except Exception as exc:
        said = _first_line(exc)
        if "MLFLOW_ALLOW_MODEL_CODE_EXECUTION" in said or "Untrusted types" in said:
            raise ConversionError(
                f"--from-mlflow {model.uri}: loading its {flavor} flavor would run code from "
                "the model files; pass --trust-pickle if you produced it yourself") from exc
        raise ConversionError(f"--from-mlflow {model.uri}: its {flavor} flavor cannot be "
                              f"loaded ({said})") from exc
    if flavor == "pytorch":
        return _plain_module(native)
    if flavor == "xgboost" and type(native).__name__ == "Booster":
        return _xgboost_estimator(native, model.uri)
    return native


def pickle_risk(flavor: str, conf: dict[str, Any], folder: Path) -> str | None:
    """What in the flavor's files can run code when loaded (``None``: nothing)."""
    if conf.get("code"):
        return f"code logged beside it ({conf['code']})"
    if flavor == "sklearn" or (flavor == "lightgbm" and not _is_booster_class(conf)):
        fmt = conf.get("serialization_format", "pickle")
        data = conf.get("pickled_model") or conf.get("data") or "model.pkl"
        if fmt != "skops":
            return f"a {fmt} file ({data})"
        untrusted = set(conf.get("skops_trusted_types") or ()) - _SAFE_SKOPS_TYPES
        if untrusted:
            return (f"a skops file that trusts {', '.join(sorted(untrusted))}, which skops "
                    f"itself does not ({data})")
    if flavor == "pytorch" and not (folder / _pytorch_data(conf) / "model.pt2").is_file():
        return f"a pickle ({_pytorch_data(conf)}/model.pth)"
    return None


def _is_booster_class(conf: dict[str, Any]) -> bool:
    return str(conf.get("model_class", "")).endswith(".Booster")


def _skops_file(flavor: str, conf: dict[str, Any]) -> str | None:
    if conf.get("serialization_format") != "skops":
        return None
    if flavor == "sklearn":
        return str(conf.get("pickled_model", "model.skops"))
    if flavor == "lightgbm" and not _is_booster_class(conf):
        return str(conf.get("data", "model.skops"))
    return None


def _pytorch_data(conf: dict[str, Any]) -> Path:
    return Path(str(conf.get("model_data", "data")))


def _plain_module(native: Any) -> Any:
    """A module the ONNX exporter can trace: an exported program's module (the ``pt2`` format)
    refuses ``eval()``, so it runs inside a plain module with its weights frozen."""
    torch = import_framework("torch", "torch")
    if not isinstance(native, torch.fx.GraphModule) or hasattr(native, "classes_"):
        return native
    for param in native.parameters():
        param.requires_grad_(False)

    module: Any = torch.nn.Module

    class ExportedProgramModule(module):
        def __init__(self, program: Any) -> None:
            super().__init__()
            object.__setattr__(self, "program", program)  # not a child: eval() stays out

        def forward(self, x: Any) -> Any:
            return self.program(x)

    return ExportedProgramModule(native)


def _xgboost_estimator(booster: Any, uri: str) -> Any:
    """A raw XGBoost ``Booster`` (``xgb.train``) as the sklearn-API model the converter takes."""
    xgb = import_framework("xgboost", "convert")
    objective = json.loads(booster.save_config())["learner"]["objective"]["name"]
    if objective in _XGB_CLASSIFIERS:
        estimator = xgb.XGBClassifier()
    elif objective.startswith("reg:"):
        estimator = xgb.XGBRegressor()
    else:
        raise ConversionError(
            f"--from-mlflow {uri}: an XGBoost Booster with objective '{objective}' cannot be "
            f"converted (redline converts {', '.join(_XGB_CLASSIFIERS)} and reg:*); "
            f"{_PYFUNC_HINT}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.ubj"
        booster.save_model(str(path))
        estimator.load_model(str(path))
    return estimator


# ----------------------------------------------------------------------- pyfunc: Python model
_COLUMN_DTYPES = {"boolean": "bool", "integer": "int32", "long": "int64", "float": "float32",
                  "double": "float64", "string": "object", "binary": "object"}


def add_pyfunc(repo: ModelRepository, name: str, model: MlflowModel, sample: Any, tmp: Path, *,
               trust_code: bool, feature_names: list[str] | None = None,
               **kwargs: Any) -> ModelMetadata:
    """The pyfunc flavor as a Python model: ``model.py`` (``mlflow_pyfunc``) loads the MLflow
    model kept beside it; the signature comes from MLflow's, the sample from its input example."""
    from redline.models.convert import mlflow_pyfunc

    if not trust_code:
        raise InvalidInput(
            f"--from-mlflow {model.uri}: its pyfunc flavor becomes a Python model, which runs "
            "the MLflow model's own code here and in every server that serves it. Only import "
            "models you produced yourself; pass --trust-code to import it")
    spec, inputs, names = pyfunc_inputs(model, sample)
    rows = pyfunc_rows(model, spec, sample)
    io: dict[str, Any] = {"input": spec}
    if model.signature is not None and model.signature.outputs is not None:
        io["outputs"], outputs = pyfunc_outputs(model.signature.outputs)
    else:  # no output schema: the outputs are what the model answers on the sample
        with mlflow_scope(None, allow_code=True):
            mlflow = import_framework("mlflow.pyfunc", "mlflow")
            answer = mlflow.load_model(str(model.folder)).predict(
                mlflow_pyfunc.pyfunc_input(io, rows))
        io["outputs"], outputs = outputs_of(answer)
    staged = tmp / "python"
    staged.mkdir()
    shutil.copyfile(mlflow_pyfunc.__file__, staged / "model.py")
    (staged / mlflow_pyfunc.IO_FILE).write_text(json.dumps(io, indent=2) + "\n")
    shutil.copytree(model.folder, staged / mlflow_pyfunc.MODEL_FOLDER)
    try:
        return repo.add_python(name, staged, rows, trust_code=True, inputs=inputs,
                               outputs=outputs, feature_names=feature_names or names, **kwargs)
    except RedlineError as exc:  # name the MLflow model, not the folder it was staged in
        said = exc.message.replace(str(staged), f"{model.uri} (pyfunc)")
        raise type(exc)(said, **exc.details) from None


def pyfunc_inputs(model: MlflowModel, sample: Any
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], list[str] | None]:
    """How redline's tensors map to the pyfunc's input (``mlflow_io.json``'s ``input``), the
    tensor specs, and the feature names of a one-matrix input."""
    schema = model.signature.inputs if model.signature is not None else None
    example = model.input_example
    if schema is None:  # no signature: what the example (or the sample) is
        if hasattr(example, "dtypes"):
            return _column_inputs(model, [str(c) for c in example.columns],
                                  [_pandas_dtype(example[c]) for c in example.columns])
        if isinstance(example, dict):
            return _tensor_inputs({str(k): np.asarray(v) for k, v in example.items()})
        rows = example if example is not None else sample
        if rows is None or isinstance(rows, dict):
            raise InvalidInput(
                f"--from-mlflow {model.uri} was logged without a signature or an input example, "
                "so its inputs are unknown: pass --sample ROWS (.npz, .npy, .csv or .parquet "
                "with representative inputs), or log the model with input_example=")
        return _tensor_inputs({"input": np.asarray(rows)}, unnamed=True)
    if schema.is_tensor_spec():
        specs = {str(s.name or "input"): s for s in schema.inputs}
        io = {"kind": "tensor", "name": "input"} if not schema.has_input_names() else {
            "kind": "tensors", "names": list(specs)}
        tensors = [{"name": n, "datatype": _v2(s.type), "shape": [-1, *list(s.shape)[1:]]}
                   for n, s in specs.items()]
        return io, tensors, None
    columns, dtypes = [], []
    for i, col in enumerate(schema.inputs):
        kind = getattr(col.type, "name", str(col.type))
        if kind not in _COLUMN_DTYPES:
            raise ConversionError(
                f"--from-mlflow {model.uri}: its input column {col.name or i} is {kind}, which "
                "redline cannot pass as a tensor (numbers, booleans and strings it can)")
        columns.append(str(col.name) if col.name is not None else f"input_{i}")
        dtypes.append(_COLUMN_DTYPES[kind])
    return _column_inputs(model, columns, dtypes)


def _column_inputs(model: MlflowModel, columns: list[str], dtypes: list[str]
                   ) -> tuple[dict[str, Any], list[dict[str, Any]], list[str] | None]:
    """Numbers alone: one matrix ``input`` (float64 where a column needs it), named by the
    columns; with strings: one tensor per column."""
    if "object" not in dtypes:
        wide = any(d in ("float64", "int64") for d in dtypes)
        io = {"kind": "frame", "name": "input", "columns": columns, "dtypes": dtypes}
        spec = {"name": "input", "datatype": "FP64" if wide else "FP32",
                "shape": [-1, len(columns)]}
        return io, [spec], columns
    io = {"kind": "columns", "columns": columns, "dtypes": dtypes}
    return io, [{"name": c, "datatype": _v2(np.dtype(d)), "shape": [-1]}
                for c, d in zip(columns, dtypes, strict=True)], None


def _tensor_inputs(arrays: dict[str, np.ndarray], unnamed: bool = False
                   ) -> tuple[dict[str, Any], list[dict[str, Any]], list[str] | None]:
    io = ({"kind": "tensor", "name": next(iter(arrays))} if unnamed
          else {"kind": "tensors", "names": list(arrays)})
    return io, [{"name": n, "datatype": _v2(a.dtype), "shape": [-1, *a.shape[1:]]}
                for n, a in arrays.items()], None


def pyfunc_rows(model: MlflowModel, io: dict[str, Any], sample: Any) -> dict[str, np.ndarray]:
    """The sample (else the input example) as redline's tensors, named as the input spec ``io``
    says."""
    rows = model.input_example if sample is None else sample
    if rows is None:
        raise InvalidInput(
            f"--from-mlflow {model.uri} was logged without an input example, so there are no "
            "rows to check the Python model on: pass --sample ROWS (.npz, .npy, .csv or "
            ".parquet with representative inputs), or log the model with input_example=")
    kind = io["kind"]
    if kind in ("frame", "columns"):
        columns = io["columns"]
        if hasattr(rows, "columns"):
            missing = [c for c in columns if c not in rows.columns]
            if missing:
                raise InvalidInput(f"--from-mlflow {model.uri}: the {_sample_word(sample)} "
                                   f"lacks the signature's columns {missing}")
            table = {c: rows[c].to_numpy() for c in columns}
        else:
            matrix = np.asarray(rows)
            if matrix.ndim != 2 or matrix.shape[1] != len(columns):
                raise InvalidInput(
                    f"--from-mlflow {model.uri}: the {_sample_word(sample)} has shape "
                    f"{matrix.shape} but the MLflow signature takes {len(columns)} columns "
                    f"({', '.join(columns)})")
            table = {c: matrix[:, i] for i, c in enumerate(columns)}
        if kind == "frame":
            dtype = np.float64 if any(d in ("float64", "int64") for d in io["dtypes"]) else (
                np.float32)
            return {"input": np.column_stack([np.asarray(table[c], dtype=dtype)
                                              for c in columns])}
        return {c: np.asarray(table[c], dtype=object if d == "object" else d)
                for c, d in zip(columns, io["dtypes"], strict=True)}
    if kind == "tensors":
        if not isinstance(rows, dict):
            raise InvalidInput(f"--from-mlflow {model.uri} takes tensors "
                               f"{', '.join(io['names'])}: pass a sample with one array each")
        return {n: np.asarray(rows[n]) for n in io["names"]}
    return {io["name"]: np.asarray(next(iter(rows.values())) if isinstance(rows, dict)
                                   else rows)}


def pyfunc_outputs(schema: Any) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """``mlflow_io.json``'s outputs and their tensor specs, from MLflow's output schema."""
    io: list[dict[str, str]] = []
    specs: list[dict[str, Any]] = []
    several = len(schema.inputs) > 1
    for i, col in enumerate(schema.inputs):
        name = str(col.name) if col.name else (f"output_{i}" if several else "output")
        if schema.is_tensor_spec():
            dtype = np.dtype(col.type)
            shape = [-1, *list(col.shape)[1:]]
        else:
            kind = getattr(col.type, "name", str(col.type))
            if kind not in _COLUMN_DTYPES:
                raise ConversionError(f"the model's output {name} is {kind}, which redline "
                                      "cannot answer as a tensor")
            dtype, shape = np.dtype(_COLUMN_DTYPES[kind]), [-1]
        io.append({"name": name, "dtype": str(dtype)})
        specs.append({"name": name, "datatype": _v2(dtype), "shape": shape})
    return io, specs


def outputs_of(answer: Any) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """Output specs read off one answer of the model (it was logged without an output schema)."""
    if isinstance(answer, dict):
        arrays = {str(k): np.asarray(v) for k, v in answer.items()}
    elif hasattr(answer, "columns"):
        arrays = {str(c): answer[c].to_numpy() for c in answer.columns}
        if len(arrays) == 1:
            arrays = {"output": next(iter(arrays.values()))}
    else:
        arrays = {"output": np.asarray(answer.to_numpy() if hasattr(answer, "to_numpy")
                                       else answer)}
    io = [{"name": n, "dtype": "object" if a.dtype.kind in "OUS" else str(a.dtype)}
          for n, a in arrays.items()]
    specs = [{"name": n, "datatype": _v2(a.dtype), "shape": [-1, *a.shape[1:]]}
             for n, a in arrays.items()]
    return io, specs


def _v2(dtype: Any) -> str:
    from redline.models.datatypes import NUMPY_TO_V2

    dtype = np.dtype(dtype)
    return "BYTES" if dtype.kind in "OUS" else NUMPY_TO_V2.get(dtype, "BYTES")


def _pandas_dtype(series: Any) -> str:
    kind = series.dtype.kind
    return {"b": "bool", "i": "int64", "u": "int64", "f": "float64"}.get(kind, "object")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].rstrip(". ")
