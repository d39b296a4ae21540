"""``redline rollout start|status|promote|abort``: canary and shadow rollouts of a version.

The commands only edit the rollout file (``scaling.rollout_file``, default
``<project>/rollout.json``) and the repository's aliases; every server sharing the project
folder follows them within a second (``scaling/rollout/``).
"""

from __future__ import annotations

from typing import Any

import click

from redline.commands._common import (
    config_option,
    emit_json,
    json_options,
    model_option,
    repository_option,
    settings_and_repo,
)
from redline.errors import InvalidInput, RepositoryError

CANARY_ALIAS = "canary"  # keeps the candidate loaded on every server during the rollout


def _need_model(model: str | None) -> str:
    if not model:
        raise click.UsageError("name the model with -m/--model NAME")
    return model


def _file(settings: Any) -> Any:
    from redline.scaling.rollout import RolloutFile, rollout_path

    return RolloutFile(rollout_path(settings))


@click.group()
def rollout() -> None:
    """Send a share of traffic (canary) or a copy of it (shadow) to a candidate version.

    \b
    Examples:
      redline rollout start -m fraud --candidate 2 --percent 10     # 10% of requests
      redline rollout start -m fraud --candidate 2 --percent 20 --sticky   # by entity key
      redline rollout start -m fraud --candidate 2 --shadow         # copies, compared
      redline rollout status -m fraud --json
      redline rollout promote -m fraud                              # production -> 2
      redline rollout abort -m fraud
    """


@rollout.command("start")
@config_option
@repository_option
@model_option
@click.option("--candidate", type=int, required=True, metavar="N",
              help="The version to roll out (already in the repository).")
@click.option("--baseline", type=int, default=None, metavar="N",
              help="The version it is compared with (default: the model's default version).")
@click.option("--percent", type=float, default=10.0, show_default=True,
              help="Share of requests (canary) or of copies (shadow) that go to the candidate.")
@click.option("--sticky", is_flag=True,
              help="Canary by entity key: an entity always sees the same version (/v1).")
@click.option("--shadow", is_flag=True,
              help="Shadow instead of canary: the candidate gets copies; answers never change.")
@click.option("--v2-only", is_flag=True,
              help="The model serves V2 requests only: start a canary of a candidate that "
                   "cannot serve /v1 (no feature names) although the baseline can.")
@click.option("--min-requests", type=int, default=None,
              help="Requests each version needs before errors and latency are judged "
                   "[default: scaling.rollout_min_requests, 200].")
@click.option("--max-error-rate-delta", type=float, default=None,
              help="Roll back when the candidate's error rate exceeds the baseline's by this "
                   "[default: 0.01].")
@click.option("--max-p99-ratio", type=float, default=None,
              help="Roll back when the candidate's p99 exceeds the baseline's times this "
                   "[default: 1.5].")
@click.option("--min-answers", type=int, default=None,
              help="Rows each version must answer before the answers are judged "
                   "[default: 200].")
@click.option("--max-prediction-psi", type=float, default=None,
              help="Roll back when an output's distribution moves this far (PSI) from the "
                   "baseline's [default: 0.25].")
@click.option("--max-mismatch-rate", type=float, default=None,
              help="Shadow: roll back when this share of copies answers differently from the "
                   "baseline (1 = off, for a candidate meant to differ) [default: 0.2].")
@click.option("--min-labels", type=int, default=None,
              help="Labels each version needs before its realised loss is judged "
                   "[default: 100].")
@click.option("--max-loss-increase", type=float, default=None,
              help="Roll back when the candidate's loss against labels exceeds the "
                   "baseline's by this share [default: 0.1].")
@json_options
def start(config_path: str | None, repository: str | None, model: str | None, candidate: int,
          baseline: int | None, percent: float, sticky: bool, shadow: bool, v2_only: bool,
          min_requests: int | None, max_error_rate_delta: float | None,
          max_p99_ratio: float | None, min_answers: int | None,
          max_prediction_psi: float | None, max_mismatch_rate: float | None,
          min_labels: int | None, max_loss_increase: float | None, as_json: bool,
          json_out: str | None) -> None:
    """Start a canary (default) or shadow rollout of version --candidate.

    The candidate is rolled back on its errors (refusing requests the baseline serves
    included), its latency, the distribution of its answers, a shadow's mismatches and its
    loss against labels; each bound defaults to the ``scaling.rollout_*`` setting. A
    candidate that cannot serve what the baseline serves (other input names; no feature
    names where the baseline serves /v1) is refused before it gets any traffic.

    \b
    Examples:
      redline rollout start -m fraud --candidate 2 --percent 10
      redline rollout start -m fraud --candidate 2 --shadow --percent 100
    """
    from redline.models import ModelRepository
    from redline.scaling.rollout import ACTIVE, RolloutSpec, unservable_candidate

    name = _need_model(model)
    settings, root = settings_and_repo(config_path, repository)
    defaults = settings.scaling

    def pick(given: Any, setting: str) -> Any:
        return given if given is not None else getattr(defaults, f"rollout_{setting}")
    repo = ModelRepository(root)
    versions = repo.versions(name)
    if candidate not in versions:
        raise InvalidInput(f"model '{name}' has no version {candidate} (versions: {versions})")
    base = baseline if baseline is not None else repo.resolve(name, None)
    spec = RolloutSpec(model=name, baseline=base, candidate=candidate,
                       mode="shadow" if shadow else "canary", percent=percent, sticky=sticky,
                       min_requests=pick(min_requests, "min_requests"),
                       max_error_rate_delta=pick(max_error_rate_delta, "max_error_rate_delta"),
                       max_p99_ratio=pick(max_p99_ratio, "max_p99_ratio"),
                       min_answers=pick(min_answers, "min_answers"),
                       max_prediction_psi=pick(max_prediction_psi, "max_prediction_psi"),
                       max_mismatch_rate=pick(max_mismatch_rate, "max_mismatch_rate"),
                       answer_rtol=defaults.rollout_answer_rtol,
                       answer_atol=defaults.rollout_answer_atol,
                       min_labels=pick(min_labels, "min_labels"),
                       max_loss_increase=pick(max_loss_increase, "max_loss_increase"))
    spec.check()
    why = unservable_candidate(repo.metadata(name, base), repo.metadata(name, candidate),
                               spec.mode, v2_only)
    if why is not None:
        raise InvalidInput(why)
    file = _file(settings)
    rollouts = file.read()
    current = rollouts.get(name)
    if current is not None and current.state == ACTIVE:
        raise RepositoryError(f"model '{name}' already has a running rollout of version "
                              f"{current.candidate}; promote or abort it first")
    if "production" not in repo.aliases(name):
        repo.promote(name, base)  # pin the baseline: a new 'latest' must not replace it
    repo.promote(name, candidate, alias=CANARY_ALIAS)
    rollouts[name] = spec
    file.write(rollouts)
    doc = {"model": name, "baseline": base, "candidate": candidate, "mode": spec.mode,
           "percent": percent, "sticky": sticky, "file": str(file.path)}
    if as_json or json_out:
        emit_json(doc, as_json, json_out)
    if not as_json:
        click.echo(f"{spec.mode} rollout of {name} v{candidate} started: {percent:g}% "
                   f"{'by entity key ' if sticky else ''}vs baseline v{base}")


@rollout.command("status")
@config_option
@model_option
@json_options
def status(config_path: str | None, model: str | None, as_json: bool,
           json_out: str | None) -> None:
    """Show rollouts, their state (running, rolled_back and why...) and the current rollout's
    per-version counts, answers compared and losses against labels.

    \b
    Examples:
      redline rollout status
      redline rollout status -m fraud --json
    """
    from dataclasses import asdict

    from redline.config import load_settings
    from redline.scaling.rollout import aggregate_stats

    settings = load_settings(config_path)
    file = _file(settings)
    rollouts = file.read()
    if model:
        rollouts = {k: v for k, v in rollouts.items() if k == model}
    stats = aggregate_stats(file, rollouts=rollouts)
    doc = {"rollouts": {n: asdict(s) for n, s in rollouts.items()}, **stats}
    if as_json or json_out:
        emit_json(doc, as_json, json_out)
    if as_json:
        return
    if not rollouts:
        click.echo("no rollouts")
    for name, s in rollouts.items():
        extra = f" ({s.failed_check + ': ' if s.failed_check else ''}{s.reason})" \
            if s.reason else ""
        click.echo(f"{name}: {s.mode} v{s.candidate} vs v{s.baseline} at {s.percent:g}% - "
                   f"{s.state}{extra}")
        for v in (s.baseline, s.candidate):
            counts = stats["versions"].get(f"{name}:{v}")
            if counts:
                refused = ", ".join(f"{n} {code}" for code, n in
                                    sorted(counts.get("refused", {}).items()))
                click.echo(f"  v{v}: {counts['requests']} requests, error rate "
                           f"{counts['error_rate']:.2%}, p99 {counts['p99_ms']:.2f} ms"
                           + (f"; refused {refused}" if refused else ""))
        if name in stats["shadow"]:
            sh = stats["shadow"][name]
            click.echo(f"  shadow: {sh['compared']} compared, {sh['mismatched']} mismatched, "
                       f"{sh['dropped']} dropped, {sh['errors']} errors, largest difference "
                       f"{sh['max_abs_diff']:.4g}, candidate p99 {sh['candidate_p99_ms']:.2f} ms")
        for output, shift in stats["answers"].get(name, {}).items():
            click.echo(f"  answers '{output}': PSI {shift['psi']:.3g} (limit {shift['limit']:.3g})"
                       f" over {shift['candidate_rows']} candidate and "
                       f"{shift['baseline_rows']} baseline rows")
        for version, loss in stats["labels"].get(name, {}).items():
            if loss["labelled"]:
                click.echo(f"  labels v{version}: {loss['labelled']}, squared error "
                           f"{loss['loss']:.4g}")


@rollout.command("promote")
@config_option
@repository_option
@model_option
def promote(config_path: str | None, repository: str | None, model: str | None) -> None:
    """Make the candidate the production version and end the rollout.

    \b
    Examples:
      redline rollout promote -m fraud
    """
    from redline.models import ModelRepository

    name = _need_model(model)
    settings, root = settings_and_repo(config_path, repository)
    spec = _file(settings).update(name, state="promoted", reason="promoted by hand")
    ModelRepository(root).promote(name, spec.candidate)
    click.echo(f"{name}: production -> version {spec.candidate}")


@rollout.command("abort")
@config_option
@model_option
def abort(config_path: str | None, model: str | None) -> None:
    """Send all traffic back to the baseline and end the rollout.

    \b
    Examples:
      redline rollout abort -m fraud
    """
    from redline.config import load_settings

    name = _need_model(model)
    spec = _file(load_settings(config_path)).update(name, state="aborted",
                                                     reason="aborted by hand")
    click.echo(f"{name}: rollout of version {spec.candidate} aborted; v{spec.baseline} serves")
