"""``redline models ...`` and ``redline predict``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from redline.commands._common import config_option, load_table, repository_option, settings_and_repo
from redline.errors import InvalidInput

PICKLE_WARNING = (
    "Loading a pickle/joblib file runs whatever code it contains. Only convert files you "
    "produced yourself; redline never loads pickles at serving time."
)


@click.group()
def models() -> None:
    """Manage the model repository: <repository>/<model>/<version>/model.onnx.

    \b
    Examples:
      redline models add fraud model.onnx --labels 0,1 --feature-names amount,hour
      redline models add fraud clf.joblib --from-pickle --trust-pickle --sample val.npz
      redline models list
      redline models promote fraud 3            # alias 'production' -> version 3
      redline models rollback fraud             # back to the previous production version
    """


@models.command("add")
@click.argument("name")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--from-pickle",
    is_flag=True,
    help="SOURCE is a pickled/joblib estimator to convert to ONNX (needs --trust-pickle).",
)
@click.option("--trust-pickle", is_flag=True, help=PICKLE_WARNING)
@click.option(
    "--sample",
    type=click.Path(dir_okay=False),
    help="Inputs (.npz with X, .npy, .csv, .parquet) for the conversion parity check and "
    "the input profile kept for drift detection.",
)
@click.option(
    "--tolerance",
    type=float,
    default=1e-4,
    show_default=True,
    help="Largest allowed difference between the original and the ONNX model.",
)
@click.option("--task", type=click.Choice(["classification", "regression"]))
@click.option("--labels", help="Comma-separated class labels, in probability-column order.")
@click.option("--feature-names", help="Comma-separated feature names in input order.")
@click.option(
    "--missing-values",
    type=click.Choice(["reject", "allow"]),
    help="Whether the model handles NaN inputs itself (default: reject NaN).",
)
@click.option("--version", "version", type=int, help="Version number (default: next).")
@click.option("--description", default="", help="Free text stored in metadata.json.")
@repository_option
@config_option
def add(
    name: str,
    source: str,
    from_pickle: bool,
    trust_pickle: bool,
    sample: str | None,
    tolerance: float,
    task: str | None,
    labels: str | None,
    feature_names: str | None,
    missing_values: str | None,
    version: int | None,
    description: str,
    repository: str | None,
    config_path: str | None,
) -> None:
    """Add SOURCE (an .onnx file, or a pickled estimator) as a new version of model NAME."""
    from redline.models import ModelRepository

    _, root = settings_and_repo(config_path, repository)
    repo = ModelRepository(root)
    names = [s.strip() for s in feature_names.split(",")] if feature_names else None
    x = load_table(sample)[0] if sample else None
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
            version=version,
            description=description,
            **({"missing_values": missing_values} if missing_values else {}),
        )
    else:
        label_list: list[Any] | None = None
        if labels:
            label_list = [
                int(v) if v.strip().lstrip("-").isdigit() else v.strip() for v in labels.split(",")
            ]
        meta = repo.add_onnx(
            name,
            source,
            version=version,
            task=task,
            class_labels=label_list,
            feature_names=names,
            sample=x,
            description=description,
            missing_values=missing_values or "reject",
        )
    click.echo(
        f"added {meta.name} version {meta.version} ({meta.framework}, sha256 "
        f"{meta.sha256[:12]}…) to {root}"
    )


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@repository_option
@config_option
def list_models(as_json: bool, repository: str | None, config_path: str | None) -> None:
    """List models, their versions, aliases and live versions."""
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
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no models in {root}; add one with `redline models add NAME model.onnx`")
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
@click.argument("name")
@click.argument("version", required=False)
@click.option("--verify", is_flag=True, help="Also check the model file against its sha256.")
@repository_option
@config_option
def show(
    name: str, version: str | None, verify: bool, repository: str | None, config_path: str | None
) -> None:
    """Show the metadata of a version (default: production alias, else latest)."""
    from redline.models import ModelRepository

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
@click.argument("name")
@click.argument("version")
@click.option("--force", is_flag=True, help="Remove even if an alias points at it.")
@repository_option
@config_option
def remove(
    name: str, version: str, force: bool, repository: str | None, config_path: str | None
) -> None:
    """Remove one version of a model."""
    from redline.models import ModelRepository

    _, root = settings_and_repo(config_path, repository)
    number = ModelRepository(root).remove(name, version, force=force)
    click.echo(f"removed {name} version {number}")


@models.command("promote")
@click.argument("name")
@click.argument("version")
@click.option("--alias", default="production", show_default=True)
@repository_option
@config_option
def promote(
    name: str, version: str, alias: str, repository: str | None, config_path: str | None
) -> None:
    """Point ALIAS (default production) at VERSION; the previous target is remembered."""
    from redline.models import ModelRepository

    _, root = settings_and_repo(config_path, repository)
    number = ModelRepository(root).promote(name, version, alias)
    click.echo(f"{name}: {alias} -> version {number}")


@models.command("rollback")
@click.argument("name")
@click.option("--alias", default="production", show_default=True)
@repository_option
@config_option
def rollback(name: str, alias: str, repository: str | None, config_path: str | None) -> None:
    """Move ALIAS back to the version it pointed at before the last promote."""
    from redline.models import ModelRepository

    _, root = settings_and_repo(config_path, repository)
    number = ModelRepository(root).rollback(name, alias)
    click.echo(f"{name}: {alias} rolled back to version {number}")


@models.command("policy")
@click.argument("name")
@click.argument("policy")
@repository_option
@config_option
def policy(name: str, policy: str, repository: str | None, config_path: str | None) -> None:
    """Set which versions a server keeps live: latest:N, all, or specific:1,3."""
    from redline.models import ModelRepository, VersionPolicy

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
@click.option("--model", "-m", "name", required=True, help="Model name in the repository.")
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
    """Run one local prediction through ONNX Runtime and print the outputs as JSON.

    \b
    Example:
      redline predict -m breast_cancer -i '[[17.99, 10.38, ...]]'
    """
    import numpy as np

    from redline.models import InferenceSession, ModelRepository

    settings, root = settings_and_repo(config_path, repository)
    if input_text.startswith("@"):
        input_text = Path(input_text[1:]).read_text()
    session = InferenceSession.load(ModelRepository(root), name, version, settings.runtime)
    outputs = session.run(session.validate(parse_predict_input(input_text, session)))
    result: dict[str, Any] = {
        "model_name": name,
        "model_version": session.metadata.version,
        "outputs": {k: np.asarray(v).tolist() for k, v in outputs.items()},
    }
    if session.metadata.class_labels:
        result["class_labels"] = session.metadata.class_labels
    click.echo(json.dumps(result))
