"""A version's files checked against the sha256 recorded when it was added, for each kind of
version: an ONNX file, a Python model's files, a graph's files."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redline.errors import CorruptModel
from redline.models.metadata import ModelMetadata
from redline.models.repository.layout import MODEL_FILE, sha256_file

if TYPE_CHECKING:
    from redline.models.repository.model_repository import ModelRepository


def verify(repo: ModelRepository, name: str, version: int | str | None = None) -> ModelMetadata:
    """Check the model file against the sha256 recorded at ``add``."""
    meta = repo.metadata(name, version)
    folder = repo.version_dir(name, meta.version)
    if repo.is_python(name, meta.version):
        from redline.models.python.session import verify_files

        verify_files(meta, folder)
        return meta
    if repo.is_dag(name, meta.version):
        from redline.models.dag.runner import verify_files as verify_graph

        verify_graph(meta, folder)
        return meta
    path = folder / MODEL_FILE
    if not path.is_file():
        raise CorruptModel(f"model file {path} is missing")
    actual = sha256_file(path)
    if actual != meta.sha256:
        raise CorruptModel(
            f"model file {path} does not match its recorded sha256 "
            f"(expected {meta.sha256[:12]}…, found {actual[:12]}…): it was modified or "
            "damaged after it was added; add the model again"
        )
    return meta
