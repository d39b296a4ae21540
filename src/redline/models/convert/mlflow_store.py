"""Where an MLflow model comes from: a logged model folder, or ``runs:/``/``models:/`` read from
a local tracking store (a ``file:`` folder or a ``sqlite:///`` file), copied to a temporary folder.

MLflow is asked to create nothing: a store that does not exist is an error, never a new empty one,
and ``mlflow_scope`` points MLflow at the store only while it reads, then puts back what it found.
A run, model or version that is not there is reported with what is there instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from redline.errors import ConversionError, InvalidInput, ModelNotFound
from redline.models.convert.frameworks import import_framework

PYFUNC_HINT = "import its pyfunc flavor as a Python model instead: --flavor pyfunc --trust-code"


@dataclass
class MlflowModel:
    """A logged MLflow model copied to local disk: its MLmodel file, signature and example."""

    uri: str
    folder: Path
    flavors: dict[str, dict[str, Any]]
    signature: Any  # mlflow.models.ModelSignature, or None
    input_example: Any  # DataFrame, ndarray, dict..., or None
    info: dict[str, Any] = field(default_factory=dict)  # provenance for metadata.json


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
                               f"be read ({first_line(exc)})") from exc
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
    said = first_line(exc)
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


def sample_word(sample: Any) -> str:
    """How a message names the rows: the model's input example, or the caller's sample."""
    return "input example" if sample is None else "--sample"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].rstrip(". ")
