"""``redline models add``: a new version from any source: an ONNX file, a pickled estimator,
a Keras or TensorFlow model, a Python model, a graph folder, or an MLflow model."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import click

from redline.commands._common import (
    config_option,
    load_table,
    model_option,
    repository_option,
    settings_and_repo,
    take_model,
)
from redline.errors import InvalidInput

TRUST_CODE_WARNING = (
    "Adding a Python model imports its model.py and runs its load and predict on the sample: "
    "whatever code it holds runs, with your permissions, here and in every server that serves "
    "it. Only add code you wrote or have read."
)
PICKLE_WARNING = (
    "Loading a pickle/joblib file runs whatever code it contains. Only convert files you "
    "produced yourself; redline never loads pickles at serving time."
)


@click.command("add")
@model_option
@click.argument("args", nargs=-1, metavar="SOURCE")
@click.option("--from-mlflow", "from_mlflow", metavar="URI",
              help="Take the model from MLflow instead of SOURCE: a logged model folder, "
              "runs:/RUN_ID/PATH or models:/NAME/VERSION (or models:/NAME@ALIAS).")
@click.option("--tracking-uri", metavar="URI",
              help="--from-mlflow: the local tracking store, a folder (file:) or SQLite file "
              "(sqlite:///); default $MLFLOW_TRACKING_URI, else ./mlruns or ./mlflow.db.")
@click.option("--flavor", type=click.Choice(["sklearn", "lightgbm", "xgboost", "pytorch", "onnx",
                                             "pyfunc"]),
              help="--from-mlflow: the flavor to import (default: the first of these the model "
              "has; pyfunc becomes a Python model and needs --trust-code).")
@click.option(
    "--from-pickle",
    is_flag=True,
    help="SOURCE is a pickled/joblib estimator to convert to ONNX (needs --trust-pickle).",
)
@click.option("--trust-pickle", is_flag=True, help=PICKLE_WARNING)
@click.option("--trust-code", is_flag=True,
              help="SOURCE is a Python model (model.py, or a folder holding one); adding it "
              "runs its code on --sample. " + TRUST_CODE_WARNING)
@click.option("--runtime", "python_runtime", type=click.Choice(["thread", "process"]),
              help="Python models: run predict in the server's threads (default) or in worker "
              "processes (for Python that holds the GIL); redline.yaml's models.NAME.runtime "
              "overrides it.")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True,
              help="Python models and graphs: seconds the model may take to load, and to "
              "answer the sample, before it is refused.")
@click.option(
    "--sample",
    type=click.Path(dir_okay=False),
    help="Inputs (.npz with X, .npy, .csv, .parquet) for the conversion parity check and "
    "the input profile kept for drift detection; for a TensorFlow model with several inputs, "
    "an .npz with one array per input name.",
)
@click.option(
    "--tolerance",
    type=float,
    default=1e-4,
    show_default=True,
    help="Largest allowed difference between the original and the ONNX model.",
)
@click.option("--task", type=click.Choice(["classification", "regression"]),
              help="What the model does (default: read from the ONNX outputs).")
@click.option("--labels", help="Comma-separated class labels, in probability-column order.")
@click.option("--feature-names", help="Comma-separated feature names in input order.")
@click.option(
    "--missing-values",
    type=click.Choice(["reject", "allow"]),
    help="Whether the model handles NaN inputs itself (default: reject NaN).",
)
@click.option("--version", "version", metavar="VERSION",
              help="Version number to create (default: the next one).")
@click.option("--description", default="", help="Free text stored in metadata.json.")
@repository_option
@config_option
def add(
    model: str | None,
    args: tuple[str, ...],
    from_mlflow: str | None,
    tracking_uri: str | None,
    flavor: str | None,
    from_pickle: bool,
    trust_pickle: bool,
    trust_code: bool,
    python_runtime: str | None,
    timeout_s: float,
    sample: str | None,
    tolerance: float,
    task: str | None,
    labels: str | None,
    feature_names: str | None,
    missing_values: str | None,
    version: str | None,
    description: str,
    repository: str | None,
    config_path: str | None,
) -> None:
    """Add SOURCE (an .onnx file, a pickled estimator, a Keras .keras file, a TensorFlow
    SavedModel folder, or a graph folder) as a new version of model NAME.

    \b
    Examples:
      redline models add -m breast_cancer .redline/demo/breast_cancer.onnx --labels 0,1
      redline models add -m bc .redline/demo/forest.joblib --from-pickle --trust-pickle \\
          --sample .redline/demo/val.npz
      redline models add -m fraud fraud.keras --sample val.npz --labels 0,1
      redline models add -m fraud export/fraud/1 --sample inputs.npz   # a SavedModel folder
      redline models add -m rowsum model.py --sample rows.npy --trust-code   # a Python model
      redline models add -m textclf textclf/ --sample rows.npz --trust-code   # a graph
      redline models add -m fraud --from-mlflow models:/fraud/3 --tracking-uri sqlite:///mlflow.db
    """
    from redline.models import ModelRepository
    from redline.models.convert import is_saved_model
    from redline.models.repository import RegistrationWarning

    usage = "redline models add -m NAME SOURCE"
    name, rest = take_model(model, args, usage)
    if from_mlflow is not None:  # the model comes from MLflow, not from a SOURCE file
        if rest:
            raise click.UsageError(f"--from-mlflow names the model; drop {' '.join(rest)}")
        source = from_mlflow
    elif flavor or tracking_uri:
        raise click.UsageError("--flavor and --tracking-uri go with --from-mlflow URI")
    elif not rest:
        raise click.UsageError(f"name the model file to add: `{usage}`")
    elif len(rest) > 1:
        raise click.UsageError(
            f"one SOURCE file, got {' '.join(rest)} (the model's name goes after -m, not "
            f"before the file): `{usage}`")
    else:
        source = rest[0]
    mlflow = from_mlflow is not None
    saved_model = not mlflow and is_saved_model(source)
    python = (not mlflow and _is_python_model(source)
              and not (Path(source) / "graph.yaml").is_file())  # a graph's folder is a graph
    is_graph = Path(source).is_dir() and not (saved_model or python or mlflow)
    if not (is_graph or saved_model or mlflow) and not Path(source).is_file():
        raise InvalidInput(f"model file {source} does not exist")
    number: int | None = None
    if version is not None:
        if not version.isdigit() or int(version) < 1:
            raise InvalidInput(f"--version must be a positive whole number, got {version!r}")
        number = int(version)
    settings, root = settings_and_repo(config_path, repository)
    repo = ModelRepository(root)
    if is_graph:  # a graph folder (graph.yaml: docs/graphs.md, docs/recommend.md)
        meta = repo.add_graph(
            name, source, version=number, description=description, trust_code=trust_code,
            sample=_named_sample(sample) if sample else None,
            feature_names=[s.strip() for s in feature_names.split(",")] if feature_names
            else None, timeout_s=timeout_s)
        if "dag" in meta.extra:
            click.echo(f"added graph {meta.name} version {meta.version} "
                       f"({len(meta.extra['dag']['signatures'])} steps; inputs "
                       f"{[t.name for t in meta.inputs]}, outputs "
                       f"{[t.name for t in meta.outputs]}) to {root}")
            return
        info = meta.extra["catalogue"]
        recall = (f", recall@{meta.extra['graph']['k']} against exact "
                  f"{info['recall_at_k']:.4f}" if "recall_at_k" in info else "")
        click.echo(f"added graph {meta.name} version {meta.version} ({info['items']} items x "
                   f"{info['dim']}, {info['index']} retrieval{recall}) to {root}")
        return
    names = [s.strip() for s in feature_names.split(",")] if feature_names else None
    if names is not None and (missing_values or "reject") == "reject":
        _check_defaults(name, names, "reject", settings)  # before any conversion work
    if python and not trust_code:
        raise click.UsageError(f"{source} is a Python model. {TRUST_CODE_WARNING} Pass "
                               "--trust-code to add it.")
    if python and not sample:
        raise click.UsageError("adding a Python model needs --sample: its rows are run to "
                               "check the model's answers against its signature")
    tensorflow = saved_model or Path(source).suffix == ".keras" or python or mlflow
    x = (_named_sample(sample) if tensorflow else load_table(sample)[0]) if sample else None
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", RegistrationWarning)
        if mlflow:
            meta = _add_mlflow(repo, name, source, tracking_uri, flavor, trust_pickle,
                               trust_code, x, tolerance, task, labels, names, missing_values,
                               number, description, python_runtime, timeout_s)
        elif python:
            meta = _add_python(repo, name, source, x, python_runtime, timeout_s, number, task,
                               labels, names, missing_values, description)
        else:
            meta = _add_file(repo, name, source, from_pickle, trust_pickle, x, tolerance, task,
                             labels, names, missing_values, number, description)
    for note in said:  # the repository's notes as one line each, any other warning as before
        if issubclass(note.category, RegistrationWarning):
            click.echo(f"warning: {note.message}", err=True)
        else:
            warnings.showwarning(note.message, note.category, note.filename, note.lineno)
    try:  # the policy a converted estimator got, and the names the model file carries
        _check_defaults(meta.name, meta.feature_names or [], meta.missing_values, settings)
    except Exception:
        repo.remove(meta.name, meta.version, force=True)
        raise
    click.echo(
        f"added {meta.name} version {meta.version} ({meta.framework}, sha256 "
        f"{meta.sha256[:12]}…) to {root}"
    )
    kept = meta.extra.get("feature_names_from_version")
    if kept is not None and meta.feature_names:
        click.echo(f"feature names: the {len(meta.feature_names)} of version {kept} (pass "
                   "--feature-names to name the columns otherwise)")


def _add_file(repo: Any, name: str, source: str, from_pickle: bool, trust_pickle: bool,
              x: Any, tolerance: float, task: str | None, labels: str | None,
              names: list[str] | None, missing_values: str | None, number: int | None,
              description: str) -> Any:
    """Convert a pickled estimator or a Keras/TensorFlow model (parity-checked on ``x``) or take
    an ONNX file; add it."""
    from redline.models.convert import is_saved_model

    label_list = _labels(labels)
    if Path(source).suffix == ".keras" or is_saved_model(source):
        if x is None:
            raise click.UsageError(
                "converting a Keras or TensorFlow model needs --sample for the parity check")
        return repo.add_estimator(
            name, source, x, tolerance=tolerance, feature_names=names, version=number,
            description=description, task=task, class_labels=label_list,
            missing_values=missing_values or "reject")
    if from_pickle or Path(source).suffix in (".pkl", ".pickle", ".joblib"):
        if not trust_pickle:
            raise click.UsageError(
                f"{source} is a pickle/joblib file. {PICKLE_WARNING} Pass --trust-pickle to "
                "convert it anyway."
            )
        if x is None:
            raise click.UsageError("converting an estimator needs --sample for the parity check")
        import joblib

        estimator = joblib.load(source)
        meta = repo.add_estimator(
            name,
            estimator,
            x,
            tolerance=tolerance,
            feature_names=names,
            version=number,
            description=description,
            **({"missing_values": missing_values} if missing_values else {}),
        )
    else:
        meta = repo.add_onnx(
            name,
            source,
            version=number,
            task=task,
            class_labels=label_list,
            feature_names=names,
            sample=x,
            description=description,
            missing_values=missing_values or "reject",
        )
    return meta


def _add_python(repo: Any, name: str, source: str, x: Any, runtime: str | None,
                timeout_s: float, number: int | None, task: str | None, labels: str | None,
                names: list[str] | None, missing_values: str | None, description: str) -> Any:
    """Add a Python model; when its code fails on the sample, its traceback comes first."""
    from redline.errors import ModelError

    try:
        return repo.add_python(
            name, source, x, trust_code=True, runtime=runtime, timeout_s=timeout_s,
            version=number, task=task or ("classification" if labels else "regression"),
            class_labels=_labels(labels), feature_names=names,
            missing_values=missing_values or "reject", description=description)
    except ModelError as exc:
        if exc.details.get("traceback"):
            click.echo(exc.details["traceback"], err=True)
        raise


def _add_mlflow(repo: Any, name: str, uri: str, tracking_uri: str | None, flavor: str | None,
                trust_pickle: bool, trust_code: bool, x: Any, tolerance: float,
                task: str | None, labels: str | None, names: list[str] | None,
                missing_values: str | None, number: int | None, description: str,
                runtime: str | None, timeout_s: float) -> Any:
    """Add an MLflow model: a native flavor converted to ONNX, or its pyfunc as a Python model
    (``redline.models.convert.from_mlflow``)."""
    from redline.errors import ModelError
    from redline.models.convert.from_mlflow import add_from_mlflow

    given = {"task": task, "class_labels": _labels(labels), "missing_values": missing_values}
    try:
        return add_from_mlflow(
            repo, name, uri, tracking_uri=tracking_uri, flavor=flavor, sample=x,
            trust_pickle=trust_pickle, trust_code=trust_code, tolerance=tolerance,
            feature_names=names, runtime=runtime, timeout_s=timeout_s, version=number,
            description=description, **{k: v for k, v in given.items() if v is not None})
    except ModelError as exc:  # a pyfunc's own code failed on the sample: its traceback first
        if exc.details.get("traceback"):
            click.echo(exc.details["traceback"], err=True)
        raise


def _is_python_model(source: str) -> bool:
    """A ``.py`` file, or a folder holding ``model.py`` (a Python model, docs/models.md)."""
    path = Path(source)
    return path.suffix == ".py" or (path.is_dir() and (path / "model.py").is_file())


def _labels(labels: str | None) -> list[Any] | None:
    if not labels:
        return None
    return [int(v) if v.strip().lstrip("-").isdigit() else v.strip() for v in labels.split(",")]


def _named_sample(path: str) -> Any:
    """A TensorFlow model's sample: an .npz's arrays by input name (``X`` alone is the rows of
    a one-input model; ``y``, the labels, is left out), else the rows of the table."""
    if Path(path).suffix.lower() != ".npz" or not Path(path).is_file():
        return load_table(path)[0]
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files if key != "y"}
    return arrays["X"] if set(arrays) == {"X"} else arrays


def _check_defaults(model: str, names: list[str], missing_values: str, settings: Any) -> None:
    """Refuse, at registration as at load, a model that rejects NaN while a feature it reads
    answers NaN for an entity with no data (degradation would become a 400), naming the fix."""
    if missing_values == "allow" or not settings.features.definitions:
        return
    from redline.features import load_definitions
    from redline.features.versioning import check_missing_policy

    check_missing_policy(model, names, missing_values, load_definitions(
        settings.features.definitions))

