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


def settings_and_repo(config_path: str | None, repository: str | None) -> tuple[Settings, Path]:
    settings = load_settings(config_path)
    return settings, Path(repository or settings.repository)


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
