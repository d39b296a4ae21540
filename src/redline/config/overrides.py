"""The layers that win over the file: ``REDLINE_<SECTION>__<KEY>`` environment variables, then
the command line's options."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import yaml

from redline.config.rules import refusal
from redline.config.settings import Settings
from redline.config.typed import convert, yaml_problem
from redline.errors import ConfigError

ENV_PREFIX = "REDLINE_"
# REDLINE_* variables that are not settings overrides.
_NOT_SETTINGS = {"REDLINE_CONFIG", "REDLINE_ADMIN_TOKEN", "REDLINE_DEBUG"}


def apply_env(settings: Settings, environ: typing.Mapping[str, str]) -> set[str]:
    """Apply ``REDLINE_<SECTION>__<KEY>=value`` overrides; returns the dotted keys it set.

    An unknown ``REDLINE_X__Y`` is an error (a typo must not silently do nothing).
    """
    done: set[str] = set()
    top = {f.name for f in dataclasses.fields(Settings) if f.name != "source"}
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in _NOT_SETTINGS:
            continue
        parts = var[len(ENV_PREFIX):].lower().split("__")
        if len(parts) == 1 and parts[0] not in top:
            continue  # another tool's REDLINE_* variable, not a setting
        _set_from_env(settings, parts, environ[var], var)
        done.add(".".join(parts))
    return done


def _set_from_env(settings: Settings, parts: list[str], raw: str, var: str) -> None:
    obj: Any = settings
    cls: Any = Settings
    where = f"environment variable {var}"
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        path = ".".join(parts[: i + 1])
        if isinstance(obj, dict):
            # models.<name>.<key>: a per-model section, made on first use
            item_cls = typing.get_args(cls)[1]
            if last:
                raise ConfigError(f"{where}: '{path}' needs a key after the name")
            if part not in obj:
                obj[part] = item_cls()
            obj, cls = obj[part], item_cls
            continue
        names = {f.name for f in dataclasses.fields(obj) if f.name != "source"}
        if part not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"{where}: unknown key '{path}' (known: {known})")
        hint = typing.get_type_hints(type(obj))[part]
        if last:
            try:
                node = yaml.compose(raw) if raw.strip() else yaml.compose("''")
            except yaml.YAMLError as exc:
                raise ConfigError(f"{where}: {raw!r} is not valid YAML ({yaml_problem(exc)}); "
                                  "quote a string value, close a [list]") from None
            try:
                value = convert(hint, node, var, path)
            except ConfigError as exc:
                raise ConfigError(exc.message.replace(f"{var}:1:", f"{where}:")) from None
            refused = refusal(type(obj), part, value, path)
            if refused is not None:
                raise ConfigError(f"{where}: {refused[1]}")
            setattr(obj, part, value)
            return
        child = getattr(obj, part)
        if child is None:  # an optional section (models.x.batching): start from its defaults
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            child = inner[0]()
            setattr(obj, part, child)
        obj, cls = child, hint



def apply_serve_options(settings: Settings, *, repository: str | None = None,
                        host: str | None = None, http_port: int | None = None,
                        grpc_port: int | None = None, no_grpc: bool = False,
                        no_watch: bool = False, store: str | None = None,
                        redis_url: str | None = None, definitions: str | None = None,
                        preload: str | None = None, admin_token: str | None = None) -> None:
    """Command-line options win over the file and the environment."""
    server = settings.server
    if repository is not None:
        settings.repository = repository
    if host is not None:
        server.host = host
    if http_port is not None:
        server.http_port = http_port
    if grpc_port is not None:
        server.grpc_port = grpc_port
    if no_grpc:
        server.grpc_enabled = False
    if no_watch:
        server.watch_repository = False
    if store:
        settings.features.store = store
    if redis_url:
        settings.features.redis_url = redis_url
        settings.features.store = store or "redis"
    if definitions:
        settings.features.definitions = definitions
    if preload:
        settings.features.preload = preload
    if admin_token:
        server.admin_enabled = True
        server.admin_token = admin_token
