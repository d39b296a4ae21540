"""``redline predict``: one local prediction through a version's runner, printed as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from redline.commands._common import config_option, repository_option, settings_and_repo
from redline.errors import InvalidInput


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
