"""``redline models ...`` and ``redline predict``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import click

from redline.commands._common import (
    config_option,
    emit_json,
    json_options,
    load_table,
    model_option,
    no_more,
    repository_option,
    settings_and_repo,
    take_model,
    take_version,
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


@click.group()
def models() -> None:
    """Manage the model repository: <repository>/<model>/<version>/model.onnx.

    \b
    Examples:
      redline models add -m breast_cancer .redline/demo/breast_cancer.onnx --labels 0,1
      redline models add -m bc .redline/demo/forest.joblib --from-pickle --trust-pickle \\
          --sample .redline/demo/val.npz
      redline models add -m fraud fraud.keras --sample val.npz --labels 0,1
      redline models list
      redline models promote -m breast_cancer --version 2   # alias production -> version 2
      redline models rollback -m breast_cancer              # back to the previous production
    """


@models.command("add")
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

    label_list: list[Any] | None = None
    if labels:
        label_list = [
            int(v) if v.strip().lstrip("-").isdigit() else v.strip() for v in labels.split(",")
        ]
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


@models.command("list")
@json_options
@repository_option
@config_option
def list_models(as_json: bool, json_out: str | None, repository: str | None,
                config_path: str | None) -> None:
    """List models, their versions, aliases and live versions.

    \b
    Columns:
      versions  every version on disk
      aliases   alias=version (promote sets 'production'; it is what a request gets by default)
      policy    which versions a server keeps loaded: latest:N, all or specific:1,3
                (set with `redline models policy`)
      live      the versions a server loads: those the policy picks, plus every alias target

    \b
    Examples:
      redline models list
      redline models list --json
    """
    from redline.models import ModelRepository

    _, root = settings_and_repo(config_path, repository)
    repo = ModelRepository(root)
    rows: list[dict[str, Any]] = [
        {
            "name": n,
            "versions": repo.versions(n),
            "aliases": repo.aliases(n),
            "policy": str(repo.policy(n)),
            "live": repo.live_versions(n),
        }
        for n in repo.list_models()
    ]
    emit_json(rows, as_json, json_out)
    if as_json:
        return
    if not rows:
        click.echo(f"no models in {root}; add one with `redline models add -m NAME model.onnx`")
        return
    click.echo(f"{'model':<24} {'versions':<16} {'aliases':<24} {'policy':<12} live")
    for r in rows:
        aliases = ",".join(f"{k}={v}" for k, v in r["aliases"].items()) or "-"
        versions = ",".join(map(str, r["versions"]))
        click.echo(
            f"{r['name']:<24} {versions:<16} {aliases:<24} {r['policy']:<12} "
            f"{','.join(map(str, r['live']))}"
        )


@models.command("show")
@model_option
@click.argument("args", nargs=-1, metavar="")
@click.option("--version", "version_opt", metavar="VERSION",
              help="Version number or alias (default: production, else the latest).")
@click.option("--verify", is_flag=True, help="Also check the model file against its sha256.")
@repository_option
@config_option
def show(
    model: str | None, args: tuple[str, ...], version_opt: str | None, verify: bool,
    repository: str | None, config_path: str | None
) -> None:
    """Show the metadata of a version (default: production alias, else latest) as JSON.

    \b
    Examples:
      redline models show -m breast_cancer
      redline models show -m breast_cancer --version 1 --verify
    """
    from redline.models import ModelRepository

    usage = "redline models show -m NAME [--version V]"
    name, rest = take_model(model, args, usage)
    version = take_version(version_opt, rest, usage)

    _, root = settings_and_repo(config_path, repository)
    repo = ModelRepository(root)
    meta = repo.verify(name, version) if verify else repo.metadata(name, version)
    data = meta.to_dict()
    profile = data.pop("input_profile", {})
    data["input_profile"] = f"{len(profile.get('features', {}))} features profiled"
    click.echo(json.dumps(data, indent=2, default=str))
    if verify:
        click.echo("sha256 verified")


@models.command("remove")
@model_option
@click.argument("args", nargs=-1, metavar="")
@click.option("--version", "version_opt", metavar="VERSION", help="Version number to remove.")
@click.option("--force", is_flag=True, help="Remove even if an alias points at it.")
@repository_option
@config_option
def remove(
    model: str | None, args: tuple[str, ...], version_opt: str | None, force: bool,
    repository: str | None, config_path: str | None
) -> None:
    """Remove one version of a model.

    \b
    Examples:
      redline models remove -m breast_cancer --version 1
      redline models remove -m breast_cancer --version 2 --force   # even if an alias points at it
    """
    from redline.models import ModelRepository

    usage = "redline models remove -m NAME --version V"
    name, rest = take_model(model, args, usage)
    version = take_version(version_opt, rest, usage)
    if version is None:
        raise click.UsageError(f"name the version to remove: `{usage}`")

    _, root = settings_and_repo(config_path, repository)
    number = ModelRepository(root).remove(name, version, force=force)
    click.echo(f"removed {name} version {number}")


@models.command("promote")
@model_option
@click.argument("args", nargs=-1, metavar="")
@click.option("--version", "version_opt", metavar="VERSION",
              help="Version number (or another alias) to point the alias at.")
@click.option("--alias", default="production", show_default=True,
              help="Alias to move; 'production' is what requests without a version get.")
@repository_option
@config_option
def promote(
    model: str | None, args: tuple[str, ...], version_opt: str | None, alias: str,
    repository: str | None, config_path: str | None
) -> None:
    """Point ALIAS (default production) at VERSION; the previous target is remembered.

    A running server picks the change up within server.watch_interval_s (hot swap).

    \b
    Examples:
      redline models promote -m breast_cancer --version 2
      redline models promote -m breast_cancer --version 3 --alias canary
    """
    from redline.models import ModelRepository

    usage = "redline models promote -m NAME --version V"
    name, rest = take_model(model, args, usage)
    version = take_version(version_opt, rest, usage)
    if version is None:
        raise click.UsageError(f"name the version to promote: `{usage}`")
    repo = ModelRepository(settings_and_repo(config_path, repository)[1])
    target = repo.metadata(name, version).version
    if repo.aliases(name).get(alias) == target:
        click.echo(f"{name}: {alias} already points at version {target}; nothing changed")
        return
    number = repo.promote(name, version, alias)
    click.echo(f"{name}: {alias} -> version {number}")


@models.command("rollback")
@model_option
@click.argument("args", nargs=-1, metavar="")
@click.option("--alias", default="production", show_default=True, help="Alias to move back.")
@repository_option
@config_option
def rollback(model: str | None, args: tuple[str, ...], alias: str, repository: str | None,
             config_path: str | None) -> None:
    """Move ALIAS back to the version it pointed at before the last promote.

    \b
    Examples:
      redline models rollback -m breast_cancer
      redline models rollback -m breast_cancer --alias canary
    """
    from redline.models import ModelRepository

    usage = "redline models rollback -m NAME"
    name, rest = take_model(model, args, usage)
    no_more(rest, usage)

    _, root = settings_and_repo(config_path, repository)
    number = ModelRepository(root).rollback(name, alias)
    click.echo(f"{name}: {alias} rolled back to version {number}")


@models.command("policy")
@model_option
@click.argument("args", nargs=-1, metavar="POLICY")
@repository_option
@config_option
def policy(model: str | None, args: tuple[str, ...], repository: str | None,
           config_path: str | None) -> None:
    """Set which versions a server keeps live: latest:N, all, or specific:1,3.

    \b
    Examples:
      redline models policy -m breast_cancer latest:2
      redline models policy -m breast_cancer specific:1,3
    """
    from redline.models import ModelRepository, VersionPolicy

    usage = "redline models policy -m NAME POLICY"
    name, rest = take_model(model, args, usage)
    if not rest:
        raise click.UsageError(f"name the policy (latest:N, all, specific:1,3): `{usage}`")
    policy = rest.pop(0)
    no_more(rest, usage)

    _, root = settings_and_repo(config_path, repository)
    repo = ModelRepository(root)
    parsed = VersionPolicy.parse(policy)
    repo.set_policy(name, parsed)
    click.echo(f"{name}: version policy {parsed}; live versions {repo.live_versions(name)}")


def parse_predict_input(text: str, session: Any) -> dict[str, Any]:
    """Accept ``[[...]]`` rows, ``{"input_name": [...]}``, or ``{"feature": value}`` for one row."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"--input is not valid JSON: {exc}") from exc
    first = session.inputs[0]
    if isinstance(data, list):
        if len(session.inputs) != 1:
            raise InvalidInput('this model has several inputs: pass {"name": [...], ...}')
        rows = data if data and isinstance(data[0], list) else [data]
        return {first.name: rows}
    if isinstance(data, dict):
        if set(data) <= {s.name for s in session.inputs}:
            return data
        names = session.metadata.feature_names
        if names and set(data) <= set(names):
            missing = [n for n in names if n not in data]
            if missing:
                raise InvalidInput(f"--input lacks feature(s) {missing}")
            return {first.name: [[data[n] for n in names]]}
        raise InvalidInput(
            f"--input keys {sorted(data)} are neither input names "
            f"{[s.name for s in session.inputs]} nor feature names"
        )
    raise InvalidInput("--input must be a JSON list of rows or an object")


@click.command("predict")
@click.option("--model", "-m", "name", required=True, metavar="NAME",
              help="Model name in the repository.")
@click.option(
    "--version", "version", default=None, help="Version or alias (default: production/latest)."
)
@click.option(
    "--input",
    "-i",
    "input_text",
    required=True,
    help='JSON: rows [[...]], {"input": [[...]]}, or {"feature": value, ...}. '
    "Use @file.json to read a file.",
)
@repository_option
@config_option
def predict(
    name: str, version: str | None, input_text: str, repository: str | None, config_path: str | None
) -> None:
    """Run one local prediction (ONNX Runtime, or a Python model) and print the outputs as JSON.

    \b
    Examples:
      redline predict -m breast_cancer -i @.redline/demo/row.json
      redline predict -m breast_cancer --version 1 -i "$(cat .redline/demo/row.json)"
    """
    import numpy as np

    from redline.models import ModelRepository, load_runner

    settings, root = settings_and_repo(config_path, repository)
    if input_text.startswith("@"):
        file = Path(input_text[1:])
        if not file.is_file():
            raise InvalidInput(f"--input file {file} does not exist")
        input_text = file.read_text()
    session = load_runner(ModelRepository(root), name, version, settings.runtime)
    try:
        outputs = session.run(session.validate(parse_predict_input(input_text, session)))
    finally:
        session.close()
    result: dict[str, Any] = {
        "model_name": name,
        "model_version": session.metadata.version,
        "outputs": {k: np.asarray(v).tolist() for k, v in outputs.items()},
    }
    if session.metadata.class_labels:
        result["class_labels"] = session.metadata.class_labels
    click.echo(json.dumps(result))
