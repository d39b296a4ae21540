"""What serves: aliases (``production`` → a version, with the history that ``rollback`` walks
back) in ``aliases.json``, the version policy in ``policy.json``, and from both the versions
that may serve and those a server keeps loaded."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redline.errors import CorruptModel, InvalidInput, RepositoryError
from redline.models.policy import VersionPolicy
from redline.models.repository.durable import dumps, write_durably
from redline.models.repository.layout import ALIASES_FILE, METADATA_FILE, POLICY_FILE, check_name

if TYPE_CHECKING:
    from redline.models.repository.model_repository import ModelRepository


def aliases(repo: ModelRepository, name: str) -> dict[str, int]:
    return {k: v["version"] for k, v in read_aliases(repo.root / name).items()}


def servable_versions(repo: ModelRepository, name: str) -> list[int]:
    """Versions that may serve without an explicit promotion: every version except those
    registered with ``requires_promotion`` (optimizer candidates) that no alias points at
    now or pointed at before (an alias's history counts: a promoted version stays
    servable after a rollback)."""
    versions = repo.require_model(name)
    promoted = set()
    for entry in read_aliases(repo.root / name).values():
        promoted.add(int(entry["version"]))
        promoted.update(int(v) for v in entry.get("history", []))
    return [v for v in versions
            if v in promoted or not _requires_promotion(repo.version_dir(name, v))]


def policy(repo: ModelRepository, name: str) -> VersionPolicy:
    path = repo.root / name / POLICY_FILE
    if not path.is_file():
        return VersionPolicy.latest(1)
    return VersionPolicy.from_dict(json.loads(path.read_text()))


def live_versions(repo: ModelRepository, name: str,
                  policy: VersionPolicy | None = None) -> list[int]:
    """Versions a server should keep loaded: the policy's, plus every alias target."""
    versions = repo.require_model(name)
    rule = policy or repo.policy(name)
    # A latest-N policy counts servable versions only, so registering an optimizer
    # candidate never pushes it (or out the version serving today); `all` and `specific`
    # load what they name, as Triton does, but only an alias makes a candidate the default.
    pool = repo.servable_versions(name) if rule.kind == "latest" else versions
    chosen = set(rule.select(pool))
    chosen.update(v for v in repo.aliases(name).values() if v in versions)
    return sorted(chosen)


def promote(repo: ModelRepository, name: str, version: int | str,
            alias: str = "production") -> int:
    check_name(alias, "alias")
    if alias == "latest":
        raise InvalidInput("'latest' is reserved: it always means the newest version")
    number = repo.resolve(name, version)
    with edit_aliases(repo.root / name) as table:
        entry = table.setdefault(alias, {"version": number, "history": []})
        if entry["version"] != number:
            entry["history"].append(entry["version"])
            entry["version"] = number
    return number


def rollback(repo: ModelRepository, name: str, alias: str = "production") -> int:
    repo.require_model(name)
    with edit_aliases(repo.root / name) as table:
        entry = table.get(alias)
        if not entry or not entry["history"]:
            raise RepositoryError(
                f"alias '{alias}' of model '{name}' has no earlier version to roll back to"
            )
        entry["version"] = entry["history"].pop()
        return int(entry["version"])


def set_policy(repo: ModelRepository, name: str, policy: VersionPolicy) -> None:
    repo.require_model(name)
    write_durably(repo.root / name / POLICY_FILE, dumps(policy.to_dict()), atomic=True)


def read_aliases(folder: Path) -> dict[str, dict[str, Any]]:
    """The model in ``folder``'s aliases: name → its version and the versions before it."""
    path = folder / ALIASES_FILE
    if not path.is_file():
        return {}
    try:
        data: dict[str, dict[str, Any]] = json.loads(path.read_text())
    except ValueError as exc:
        raise CorruptModel(f"aliases file {path} is not valid JSON; fix or delete it") from exc
    return data


@contextlib.contextmanager
def edit_aliases(folder: Path) -> Iterator[dict[str, dict[str, Any]]]:
    table = read_aliases(folder)
    yield table
    write_durably(folder / ALIASES_FILE, dumps(table), atomic=True)


def _requires_promotion(version_dir: Path) -> bool:
    try:
        return bool(json.loads((version_dir / METADATA_FILE).read_text())
                    .get("requires_promotion", False))
    except (OSError, ValueError):
        return False  # unreadable metadata is reported when the version is loaded
