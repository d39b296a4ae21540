"""``redline models ...``: the repository's group, and its commands that list, show, remove,
promote, roll back and set the policy of versions (``add`` is ``models_add.py``)."""

from __future__ import annotations

import json
from typing import Any

import click

from redline.commands._common import (
    config_option,
    emit_json,
    json_options,
    model_option,
    no_more,
    repository_option,
    settings_and_repo,
    take_model,
    take_version,
)
from redline.commands.models_add import add


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


models.add_command(add)


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

