"""``ModelRepository``: a folder of models and their versions, found, resolved and read here;
each kind of write is a module beside this one, attached as a method."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from redline.errors import (
    CorruptModel,
    InvalidInput,
    ModelNotFound,
    RepositoryError,
    VersionNotFound,
)
from redline.models.metadata import ModelMetadata
from redline.models.repository import graph_versions, integrity, onnx_versions, promotion
from redline.models.repository.durable import remove_folder, write_version
from redline.models.repository.layout import (
    GRAPH_FILE,
    METADATA_FILE,
    MODEL_FILE,
    PYTHON_FILE,
)


class ModelRepository:
    """Versioned models in a folder. Safe for several processes reading while one writes.

    Reading is here; promotion, verification and adding versions are functions of the modules
    beside this one, attached below as methods (their first argument is the repository)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    # ----------------------------------------------------------------- reading
    def list_models(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and self.versions(p.name)
        )

    def versions(self, name: str) -> list[int]:
        """Visible versions of ``name``, ascending. Temporary folders are never visible."""
        folder = self.root / name
        if not folder.is_dir():
            return []
        return sorted(
            int(p.name)
            for p in folder.iterdir()
            if p.name.isdigit() and (p / METADATA_FILE).is_file()
        )

    def require_model(self, name: str) -> list[int]:
        """The versions of ``name``; a model with none is not found, and the error says so."""
        versions = self.versions(name)
        if not versions:
            known = ", ".join(self.list_models()) or "none"
            raise ModelNotFound(
                f"model '{name}' not found in repository {self.root} (known models: {known}); "
                "add it with `redline models add -m NAME FILE`"
            )
        return versions

    def resolve(self, name: str, version: int | str | None = None) -> int:
        """A concrete version number: ``None`` means the ``production`` alias, else the newest
        servable version (never an unpromoted candidate); ``latest`` is the newest of all."""
        versions = self.require_model(name)
        if version is None or version == "":
            production = self.aliases(name).get("production")
            if production is not None:
                return production
            servable = self.servable_versions(name)
            return servable[-1] if servable else versions[-1]
        if isinstance(version, str) and not version.isdigit():
            if version == "latest":
                return versions[-1]
            aliases = self.aliases(name)
            if version not in aliases:
                raise VersionNotFound(
                    f"model '{name}' has no version or alias '{version}' "
                    f"(versions: {versions}, aliases: {sorted(aliases) or 'none'})"
                )
            return aliases[version]
        number = int(version)
        if number not in versions:
            raise VersionNotFound(f"model '{name}' has no version {number} (versions: {versions})")
        return number

    def version_dir(self, name: str, version: int) -> Path:
        return self.root / name / str(version)

    def model_path(self, name: str, version: int) -> Path:
        """The version's ONNX file; a Python model (``model.py``) has none, and says so."""
        folder = self.version_dir(name, self.resolve(name, version))
        if not (folder / MODEL_FILE).is_file() and (folder / PYTHON_FILE).is_file():
            raise InvalidInput(f"version {folder.name} of model '{name}' is a Python model "
                               f"({PYTHON_FILE}): it has no ONNX file to work on")
        if self.is_dag(name, int(folder.name)):
            raise InvalidInput(f"version {folder.name} of model '{name}' is a graph of steps "
                               f"({GRAPH_FILE}): it has no ONNX file to work on")
        return folder / MODEL_FILE

    def is_python(self, name: str, version: int) -> bool:
        """Whether the version is a Python model: its folder holds ``model.py``."""
        return (self.version_dir(name, version) / PYTHON_FILE).is_file()

    def is_dag(self, name: str, version: int) -> bool:
        """Whether the version is a general graph (``models/dag/``): its folder holds
        ``graph.yaml`` and no model of its own (a recommender graph's ranker is one)."""
        folder = self.version_dir(name, version)
        return ((folder / GRAPH_FILE).is_file() and not (folder / MODEL_FILE).is_file()
                and not (folder / PYTHON_FILE).is_file())

    def metadata(self, name: str, version: int | str | None = None) -> ModelMetadata:
        number = self.resolve(name, version)
        path = self.version_dir(name, number) / METADATA_FILE
        try:
            return ModelMetadata.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptModel(
                f"metadata file {path} is unreadable ({exc}); remove the version with "
                f"`redline models remove -m {name} --version {number}` and add it again"
            ) from exc

    verify = integrity.verify  # the files against their recorded sha256 (integrity.py)

    # ----------------------------------------------------------------- what serves (promotion.py)
    aliases = promotion.aliases
    servable_versions = promotion.servable_versions
    policy = promotion.policy
    live_versions = promotion.live_versions
    promote = promotion.promote
    rollback = promotion.rollback
    set_policy = promotion.set_policy

    # ----------------------------------------------------------------- adding versions
    add_onnx = onnx_versions.add_onnx  # an ONNX file (onnx_versions.py)
    add_estimator = onnx_versions.add_estimator  # a framework model, converted to ONNX
    add_graph = graph_versions.add_graph  # a graph folder (graph_versions.py)

    def add_python(self, name: str, source: str | os.PathLike[str], sample: Any,
                   **kwargs: Any) -> ModelMetadata:
        """Check a Python model (``model.py``, or a folder holding one) on ``sample`` in a worker
        process and store it as a new version, atomically (``models/python/add.py``)."""
        from redline.models.python.add import add_python

        return add_python(self, name, source, sample, **kwargs)

    def write_files(self, name: str, meta: ModelMetadata, version: int | None,
                    folder: Path) -> ModelMetadata:
        """Store every file under ``folder`` as a new version described by ``meta``,
        atomically (a checked Python model's files)."""
        files = {p.relative_to(folder).as_posix(): p
                 for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.write_version(name, None, meta, version, files)

    def write_version(self, name: str, data: bytes | None, meta: ModelMetadata,
                      version: int | None, files: dict[str, Path] | None = None
                      ) -> ModelMetadata:
        """Store ``meta`` (``data`` as ``model.onnx``, ``files`` beside it) as version
        ``version``, else the next one, atomically (``durable.py``)."""
        return write_version(self.root / name, data, meta, version, files,
                             lambda: self.versions(name))

    # ----------------------------------------------------------------- removing
    def remove(self, name: str, version: int | str, *, force: bool = False) -> int:
        number = self.resolve(name, version)
        pinned = [a for a, v in self.aliases(name).items() if v == number]
        if pinned and not force:
            raise RepositoryError(
                f"version {number} of '{name}' is the target of alias(es) {pinned}; promote "
                "another version first or pass --force"
            )
        remove_folder(self.version_dir(name, number), f"rm-{number}")  # gone in one step
        if pinned:
            with promotion.edit_aliases(self.root / name) as aliases:
                for alias in pinned:
                    aliases.pop(alias, None)
        return number
