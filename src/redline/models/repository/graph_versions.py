"""Graph versions: a graph folder (``graph.yaml``) checked and stored. A general graph of named
steps goes to ``models/dag/``; the recommender's fixed sequence (``models/graph.py``) is checked
here, its ANN index built when the catalogue is large, and its ranker stored as the version's
model: ``model.onnx``, or ``model.py`` for a Python ranker.

The graph modules are imported when a graph is added: they pull in numpy, YAML and faiss.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redline.errors import InvalidInput, ModelError
from redline.models.metadata import ModelMetadata
from redline.models.onnxfile import inspect_onnx
from redline.models.repository.layout import PYTHON_FILE, check_name

if TYPE_CHECKING:
    from redline.models.repository.model_repository import ModelRepository


def add_graph(
    repo: ModelRepository,
    name: str,
    folder: str | os.PathLike[str],
    *,
    version: int | None = None,
    description: str = "",
    trust_code: bool = False,
    sample: Any = None,
    feature_names: list[str] | None = None,
    feature_views: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> ModelMetadata:
    """Check a graph folder (``graph.yaml``) and store it as a new version, atomically.

    Every graph comes in here and goes by its kind: a general graph of named steps
    (``models/dag/``, ``docs/graphs.md``; ``sample`` is run through it once) or the
    recommender's fixed sequence (``models/graph.py``, ``docs/recommend.md``), whose ANN
    index is built here when the catalogue is large.

    The ranking model becomes the version's ``model.onnx`` (it loads, batches and reports
    like any model); the graph's other files sit next to it. A Python ranker (``rank:
    {model: ranker.py}``, needs ``trust_code``) becomes the version's ``model.py``, checked
    on rows made from the catalogue as any Python model is."""
    import yaml

    from redline.models import graph as g

    check_name(name)
    src = Path(folder)
    spec_path = src / g.GRAPH_FILE
    if not spec_path.is_file():
        raise InvalidInput(f"{src} has no {g.GRAPH_FILE}: a graph folder needs one (a "
                           "TensorFlow SavedModel folder has saved_model.pb)")
    try:
        doc = yaml.safe_load(spec_path.read_text())
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{spec_path} is not valid YAML ({exc})") from exc
    from redline.models.dag.spec import is_dag

    if is_dag(doc):
        from redline.models.dag.check import add_dag

        return add_dag(repo, name, src, doc, version=version, description=description,
                       trust_code=trust_code, sample=sample, feature_names=feature_names,
                       feature_views=feature_views, timeout_s=timeout_s)
    if sample is not None or feature_names is not None:
        raise InvalidInput(f"{spec_path}: a recommender graph takes no --sample nor "
                           "--feature-names (its steps name what they read)")
    return _add_recommender(repo, name, src, doc, version, description, trust_code)


def _add_recommender(repo: ModelRepository, name: str, src: Path, doc: Any,
                     version: int | None, description: str, trust_code: bool) -> ModelMetadata:
    """The recommender's graph: catalogue and ranker checked, the ANN index built if the
    catalogue is large, stored with its ranker as the version's model."""
    from redline.models import graph as g

    spec_path = src / g.GRAPH_FILE
    spec = g.parse_graph(doc, str(spec_path))
    cat = g.load_catalogue(src)
    dim = g.check_graph(spec, cat, src, str(spec_path))
    ranker = src / spec.ranker
    if not ranker.is_file():
        raise InvalidInput(f"{spec_path}: the rank step's model {ranker} does not exist")
    python = ranker.suffix == ".py"
    if python:
        from redline.models.python.add import TRUST_WARNING

        if not trust_code:
            raise InvalidInput(f"{spec_path}: the rank step's model {ranker} is Python. "
                               f"{TRUST_WARNING} Pass trust_code=True (--trust-code).")
    else:
        data = ranker.read_bytes()
        inputs, outputs = inspect_onnx(data, str(ranker))
        width = inputs[0].shape[-1] if inputs and inputs[0].shape else -1
        if len(inputs) != 1 or width not in (-1, len(spec.rank_features)):
            raise InvalidInput(f"{spec_path}: the ranker must take one input of "
                               f"{len(spec.rank_features)} columns (rank.features), got "
                               f"{[(i.name, i.shape) for i in inputs]}")
    files: dict[str, Path] = {g.GRAPH_FILE: spec_path, g.ITEMS_NPY: src / g.ITEMS_NPY,
                              g.ITEMS_TABLE: src / g.ITEMS_TABLE}
    if spec.encoder is not None:
        files[g.ENCODER_FILE] = src / spec.encoder
    info: dict[str, Any] = {"items": cat.size, "dim": dim, "index": "exact"}
    with tempfile.TemporaryDirectory() as tmp:
        if g.uses_ann(spec, cat.size):
            import faiss

            index = g.build_index(cat, spec)
            info.update(index="hnsw", recall_at_k=round(g.measure_recall(index, cat, spec.k),
                                                        4))
            faiss.write_index(index, str(Path(tmp) / g.INDEX_FILE))
            files[g.INDEX_FILE] = Path(tmp) / g.INDEX_FILE
        if python:
            return _add_python_ranked(repo, name, src, spec, cat, files, info, version,
                                      description)
        meta = ModelMetadata(
            name=name, version=0, inputs=inputs, outputs=outputs,
            sha256=hashlib.sha256(data).hexdigest(), task="regression",
            feature_names=list(spec.rank_features), framework="graph",
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            description=description, missing_values="allow",
            extra={"graph": spec.to_dict(), "catalogue": info},
        )
        return repo.write_version(name, data, meta, version, files)


def _add_python_ranked(repo: ModelRepository, name: str, src: Path, spec: Any, cat: Any,
                       files: dict[str, Path], info: dict[str, Any], version: int | None,
                       description: str) -> ModelMetadata:
    """A graph whose ranker is Python: the graph's files and ``model.py`` in one folder,
    added as a Python model (checked on rows of the rank features) that carries the graph."""
    from redline.models import graph as g
    from redline.models.python.add import add_python

    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "graph"
        staged.mkdir()
        for file_name, path in files.items():
            shutil.copyfile(path, staged / file_name)
        shutil.copyfile(src / spec.ranker, staged / PYTHON_FILE)
        try:
            return add_python(
                repo, name, staged, g.rank_sample(spec, cat), trust_code=True,
                version=version, feature_names=list(spec.rank_features),
                missing_values="allow", description=description, framework="graph",
                extra={"graph": spec.to_dict(), "catalogue": info})
        except (InvalidInput, ModelError) as exc:
            def mine(text: str) -> str:  # the user's file, not the staged copy
                return (text.replace(str(staged / PYTHON_FILE), str(src / spec.ranker))
                        .replace(str(staged), str(src))
                        .replace(f"({PYTHON_FILE}, line", f"({Path(spec.ranker).name}, line"))

            details = {k: mine(v) if isinstance(v, str) else v
                       for k, v in exc.details.items()}
            raise type(exc)(f"{src / g.GRAPH_FILE}: the rank step's model "
                            f"{src / spec.ranker}: {mine(exc.message)}", **details) from None
