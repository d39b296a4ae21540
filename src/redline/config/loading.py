"""Loading ``redline.yaml``: find the file, build it strictly, resolve its paths against its
folder, apply the environment, and put the repository and registry in the project folder."""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

import yaml

from redline.config.overrides import apply_env
from redline.config.settings import Settings
from redline.config.typed import build, yaml_problem
from redline.errors import ConfigError

DEFAULT_CONFIG_FILE = "redline.yaml"


def load_settings(path: str | os.PathLike[str] | None = None,
                  environ: typing.Mapping[str, str] | None = None) -> Settings:
    """Load settings from ``path``, or ``./redline.yaml`` if it exists, or the defaults; then
    apply ``REDLINE_<SECTION>__<KEY>`` environment overrides."""
    env = os.environ if environ is None else environ
    if path is None:
        env_path = env.get("REDLINE_CONFIG")
        path = env_path or (DEFAULT_CONFIG_FILE if Path(DEFAULT_CONFIG_FILE).exists() else None)
    settings, explicit = (Settings(), set()) if path is None else _load_file(Path(path))
    overridden = apply_env(settings, env)
    _default_project_paths(settings, explicit | overridden)
    return settings


def _load_file(file: Path) -> tuple[Settings, set[str]]:
    """The settings ``file`` holds, and the dotted keys it names."""
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from exc
    try:
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(file)
        raise ConfigError(f"{where}: not valid YAML: {yaml_problem(exc)}; fix the file "
                          "there (indent with spaces, quote a value holding ': ' or '#')"
                          ) from None
    if node is None:
        settings, explicit = Settings(), set()
    else:
        settings, explicit = build(Settings, node, str(file), ""), _mapping_keys(node, "")
    settings.source = str(file)
    # Every path the file names (and the default project folder) is relative to the file.
    _resolve_paths(settings, file.parent)
    return settings, explicit


def _mapping_keys(node: yaml.Node, prefix: str) -> set[str]:
    keys: set[str] = set()
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            path = f"{prefix}.{k.value}" if prefix else str(k.value)
            keys.add(path)
            keys |= _mapping_keys(v, path)
    return keys


def _resolve_paths(obj: Any, base: Path) -> None:
    """Make every relative path field of ``obj`` (recursively) relative to ``base``."""
    if base == Path(""):
        return
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        kind = f.metadata.get("path")
        if kind and isinstance(value, str) and value and not os.path.isabs(value):
            if kind == "module-or-file" and not _looks_like_file(value):
                continue  # a module name (pkg.features) stays as it is
            setattr(obj, f.name, os.path.normpath(base / value))
        elif dataclasses.is_dataclass(value):
            _resolve_paths(value, base)
        elif isinstance(value, dict):
            for item in value.values():
                if dataclasses.is_dataclass(item):
                    _resolve_paths(item, base)


def _looks_like_file(value: str) -> bool:
    return value.endswith(".py") or "/" in value or os.sep in value


def _default_project_paths(settings: Settings, explicit: set[str]) -> None:
    """The repository and the registry live in one project folder unless named on their own."""
    if "repository" not in explicit:
        settings.repository = os.path.join(settings.project, "models")
    if "features.registry" not in explicit:
        settings.features.registry = os.path.join(settings.project, "features")

