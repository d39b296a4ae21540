"""What the ``features`` and ``ingest`` commands share: the definitions and store options, and
the feature settings with a command's overrides."""

from __future__ import annotations

from typing import Any

import click

from redline.config import FeatureSettings, load_settings
from redline.errors import ConfigError


def feature_settings(config_path: str | None, definitions: str | None, store: str | None = None,
                     redis_url: str | None = None,
                     sessions_only: bool = False) -> tuple[FeatureSettings, Any]:
    """Feature settings with the command's overrides, and the definitions they name.

    ``sessions_only``: an ingest without definitions (a recommender with no feature views)
    takes events of source ``session`` only; any other event is a dead letter saying why."""
    from redline.features import load_definitions

    fs = load_settings(config_path).features
    if store:
        fs.store = store
    if redis_url:
        fs.redis_url = redis_url
        fs.store = store or "redis"
    target = definitions or fs.definitions
    if not target and sessions_only:
        from redline.features.definitions import FeatureDefinitions

        click.echo('ingest: no feature definitions: only events of source "session" are '
                   "stored (pass --definitions FILE.py for feature events)", err=True)
        return fs, FeatureDefinitions.of([], origin="no feature definitions")
    if not target:
        raise ConfigError("no feature definitions: pass --definitions FILE.py or set "
                          "features.definitions in redline.yaml")
    return fs, load_definitions(target)


def definitions_option(func: Any) -> Any:
    return click.option("--definitions", "-d", default=None,
                        help="Definitions file or module (default: features.definitions).")(func)


def store_options(func: Any) -> Any:
    func = click.option("--store", type=click.Choice(["memory", "redis"]), default=None,
                        help="Online store (default: features.store).")(func)
    return click.option("--redis-url", default=None,
                        help="Redis URL (default: features.redis_url).")(func)

