"""Options and helpers shared by the command modules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from redline.config import Settings, load_settings

F = TypeVar("F", bound=Callable[..., Any])


def config_option(func: F) -> F:
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=None,
        help="Settings file (default: ./redline.yaml if present, else built-in defaults).",
    )(func)


def repository_option(func: F) -> F:
    return click.option(
        "--repository",
        "-r",
        type=click.Path(file_okay=False),
        default=None,
        help="Model repository folder (default: `repository` in redline.yaml, .redline/models).",
    )(func)


def model_option(func: F) -> F:
    """The model is ``-m/--model NAME`` in every command."""
    return click.option("--model", "-m", "model", default=None, metavar="NAME",
                        help="Model name in the repository.")(func)


def json_options(func: F) -> F:
    """``--json`` prints JSON to stdout; ``--json-out FILE`` writes it to a file."""
    func = click.option("--json-out", "json_out", type=click.Path(dir_okay=False), default=None,
                        metavar="FILE", help="Also write the JSON result to FILE.")(func)
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the result as JSON on stdout instead of text.")(func)


def store_options(func: F) -> F:
    """``--store`` and ``--redis-url`` wherever an online store is used."""
    func = click.option("--store", type=click.Choice(["memory", "redis"]), default=None,
                        help="Online store (default: features.store, memory).")(func)
    return click.option("--redis-url", default=None, metavar="URL",
                        help="Redis URL, e.g. redis://127.0.0.1:6379/0 (implies --store redis; "
                             "default: features.redis_url).")(func)


def take_model(model: str | None, args: tuple[str, ...] | list[str],
               usage: str) -> tuple[str, list[str]]:
    """The model from ``-m/--model NAME``, the one shape every command takes.

    A model named without ``-m`` is refused rather than read as something else: it would land
    where a file or a version is expected. Returns the name and the positional arguments.
    """
    rest = list(args)
    if not model:
        raise click.UsageError(f"name the model with -m/--model NAME: `{usage}`")
    return model, rest


def take_version(version: str | None, rest: list[str], usage: str) -> str | None:
    """The version from ``--version V``; a bare positional one is refused with the usage."""
    if rest:
        raise click.UsageError(
            f"unexpected argument(s) {' '.join(rest)}; pass a version with --version: `{usage}`")
    return version


def no_more(rest: list[str], usage: str) -> None:
    if rest:
        raise click.UsageError(f"unexpected argument(s) {' '.join(rest)}; usage: `{usage}`")


def settings_and_repo(config_path: str | None, repository: str | None) -> tuple[Settings, Path]:
    settings = load_settings(config_path)
    return settings, Path(repository or settings.repository)


def emit_json(doc: Any, as_json: bool, json_out: str | None) -> None:
    """Print ``doc`` as JSON when ``--json``; write it to ``--json-out FILE`` when given."""
    import json

    text = json.dumps(doc, indent=2, default=str)
    if json_out:
        Path(json_out).write_text(text + "\n")
    if as_json:
        click.echo(text)


def load_table(path: str, label: str | None = None) -> tuple[Any, Any, list[str] | None]:
    """Read X (and y when ``label`` is named or an .npz holds it) from .npz, .csv or .parquet."""
    import numpy as np

    from redline.errors import InvalidInput

    file = Path(path)
    if not file.is_file():
        raise InvalidInput(f"data file {file} does not exist")
    suffix = file.suffix.lower()
    if suffix == ".npz":
        data = np.load(file, allow_pickle=False)
        if "X" not in data:
            raise InvalidInput(f"{file} has no array named 'X' (found {list(data)})")
        return data["X"], (data["y"] if "y" in data else None), None
    if suffix == ".npy":
        return np.load(file, allow_pickle=False), None, None
    if suffix in (".csv", ".parquet"):
        import pandas as pd

        frame = pd.read_csv(file) if suffix == ".csv" else pd.read_parquet(file)
        y = None
        if label is not None:
            if label not in frame.columns:
                raise InvalidInput(
                    f"{file} has no label column '{label}' (columns: {list(frame.columns)})"
                )
            y = frame.pop(label).to_numpy()
        return frame.to_numpy(dtype=np.float32), y, [str(c) for c in frame.columns]
    raise InvalidInput(f"unsupported data file {file}: use .npz (X, y), .npy, .csv or .parquet")
