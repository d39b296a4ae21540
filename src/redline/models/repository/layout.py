"""The names of the on-disk layout: the files a model's folder and a version's folder hold, the
rule a model or alias name follows, and the sha256 that fingerprints a version's file."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from redline.errors import InvalidInput

MODEL_FILE = "model.onnx"
PYTHON_FILE = "model.py"  # in place of model.onnx: a Python model (models/python/)
METADATA_FILE = "metadata.json"
ALIASES_FILE = "aliases.json"
POLICY_FILE = "policy.json"
GRAPH_FILE = "graph.yaml"  # a graph version: the recommender's (with its ranker) or general
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_name(name: str, what: str = "model name") -> str:
    if not _NAME_RE.match(name) or name.isdigit():
        raise InvalidInput(
            f"invalid {what} {name!r}: use letters, digits, '_', '-', '.' (not only digits, "
            "at most 128 characters, starting with a letter or digit)"
        )
    return name
