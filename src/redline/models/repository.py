"""The model repository on disk: ``<repository>/<model>/<version>/{model.onnx,metadata.json}``.

Legible without docs, like Triton's: list a folder and you see the models and their versions.
Per model, ``aliases.json`` maps names such as ``production`` to a version (with the history that
``rollback`` walks back) and ``policy.json`` holds the version policy. Every write is atomic: a
version is assembled in a hidden temporary folder and renamed into place in one step, so a crash
or a full disk never leaves a half-written version visible.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import os
import re
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from redline.errors import (
    CorruptModel,
    InvalidInput,
    ModelError,
    ModelNotFound,
    RepositoryError,
    VersionNotFound,
)
from redline.models.metadata import (
    QUALITY_METRICS,
    ModelMetadata,
    TensorSpec,
    profile_inputs,
    validation_figures,
)
from redline.models.onnxfile import inspect_onnx
from redline.models.policy import VersionPolicy

MODEL_FILE = "model.onnx"
PYTHON_FILE = "model.py"  # in place of model.onnx: a Python model (models/python/)
METADATA_FILE = "metadata.json"
ALIASES_FILE = "aliases.json"
POLICY_FILE = "policy.json"
GRAPH_FILE = "graph.yaml"  # a graph version: the recommender's (with its ranker) or general
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_TMP_PREFIX = ".tmp-"


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


class RegistrationWarning(UserWarning):
    """A version was added, but not quite as asked: names dropped, no validation figure."""


class ModelRepository:
    """Versioned ONNX models in a folder. Safe for several processes reading while one writes."""

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

    def _require_model(self, name: str) -> list[int]:
        versions = self.versions(name)
        if not versions:
            known = ", ".join(self.list_models()) or "none"
            raise ModelNotFound(
                f"model '{name}' not found in repository {self.root} (known models: {known}); "
                "add it with `redline models add -m NAME FILE`"
            )
        return versions

    def aliases(self, name: str) -> dict[str, int]:
        return {k: v["version"] for k, v in self._read_aliases(name).items()}

    def servable_versions(self, name: str) -> list[int]:
        """Versions that may serve without an explicit promotion: every version except those
        registered with ``requires_promotion`` (optimizer candidates) that no alias points at
        now or pointed at before (an alias's history counts: a promoted version stays
        servable after a rollback)."""
        versions = self._require_model(name)
        promoted = set()
        for entry in self._read_aliases(name).values():
            promoted.add(int(entry["version"]))
            promoted.update(int(v) for v in entry.get("history", []))
        return [v for v in versions if v in promoted or not self._requires_promotion(name, v)]

    def _requires_promotion(self, name: str, version: int) -> bool:
        path = self.version_dir(name, version) / METADATA_FILE
        try:
            return bool(json.loads(path.read_text()).get("requires_promotion", False))
        except (OSError, ValueError):
            return False  # unreadable metadata is reported when the version is loaded

    def resolve(self, name: str, version: int | str | None = None) -> int:
        """A concrete version number: ``None`` means the ``production`` alias, else the newest
        servable version (never an unpromoted candidate); ``latest`` is the newest of all."""
        versions = self._require_model(name)
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

    def verify(self, name: str, version: int | str | None = None) -> ModelMetadata:
        """Check the model file against the sha256 recorded at ``add``."""
        meta = self.metadata(name, version)
        if self.is_python(name, meta.version):
            from redline.models.python.session import verify_files

            verify_files(meta, self.version_dir(name, meta.version))
            return meta
        if self.is_dag(name, meta.version):
            from redline.models.dag.runner import verify_files as verify_graph

            verify_graph(meta, self.version_dir(name, meta.version))
            return meta
        path = self.version_dir(name, meta.version) / MODEL_FILE
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

    def policy(self, name: str) -> VersionPolicy:
        path = self.root / name / POLICY_FILE
        if not path.is_file():
            return VersionPolicy.latest(1)
        return VersionPolicy.from_dict(json.loads(path.read_text()))

    def live_versions(self, name: str, policy: VersionPolicy | None = None) -> list[int]:
        """Versions a server should keep loaded: the policy's, plus every alias target."""
        versions = self._require_model(name)
        rule = policy or self.policy(name)
        # A latest-N policy counts servable versions only, so registering an optimizer
        # candidate never pushes it (or out the version serving today); `all` and `specific`
        # load what they name, as Triton does, but only an alias makes a candidate the default.
        pool = self.servable_versions(name) if rule.kind == "latest" else versions
        chosen = set(rule.select(pool))
        chosen.update(v for v in self.aliases(name).values() if v in versions)
        return sorted(chosen)

    # ----------------------------------------------------------------- writing
    def add_onnx(
        self,
        name: str,
        source: bytes | str | os.PathLike[str],
        *,
        version: int | None = None,
        task: str | None = None,
        class_labels: list[Any] | None = None,
        feature_names: list[str] | None = None,
        framework: str = "onnx",
        framework_version: str = "",
        metrics: dict[str, float] | None = None,
        sample: Any = None,
        input_profile: dict[str, Any] | None = None,
        missing_values: str = "reject",
        feature_views: dict[str, str] | None = None,
        fallback: str | None = None,
        description: str = "",
        extra: dict[str, Any] | None = None,
        requires_promotion: bool = False,
    ) -> ModelMetadata:
        """Validate an ONNX model and store it as a new version, atomically.

        ``requires_promotion`` registers a version that serves only once an alias points at it.
        """
        check_name(name)
        if missing_values not in ("reject", "allow"):
            raise InvalidInput("missing_values must be 'reject' or 'allow'")
        data, origin = _read_source(source)
        inputs, outputs = inspect_onnx(data, origin)
        if task is None:
            task = "classification" if class_labels else "regression"
        extra = dict(extra or {})
        if feature_names is None:  # a retrained model reads the features its last version read
            feature_names, names_from = self._latest_feature_names(name, inputs)
            if names_from is not None:
                extra["feature_names_from_version"] = names_from
        if metrics and not validation_figures(metrics, task)[0]:
            wanted = ", ".join(QUALITY_METRICS.get(task, ())) or "none"
            warnings.warn(
                f"none of the metrics of '{name}' ({', '.join(metrics)}) is a validation figure "
                f"live quality compares a {task} model against ({wanted}; a split suffix such "
                "as _holdout or _validation is fine): this version's live quality can never "
                "alarm. Record one of those names.", RegistrationWarning, stacklevel=2)
        if feature_names is not None and inputs and len(inputs[0].shape) == 2:
            width = inputs[0].shape[1]
            if width not in (-1, len(feature_names)):
                raise InvalidInput(
                    f"{len(feature_names)} feature names given but input '{inputs[0].name}' "
                    f"has {width} columns"
                )
        profile = (
            input_profile
            if input_profile is not None
            else (profile_inputs(sample, feature_names) if sample is not None else {})
        )
        meta = ModelMetadata(
            name=name,
            version=0,
            inputs=inputs,
            outputs=outputs,
            sha256=hashlib.sha256(data).hexdigest(),
            task=task,
            class_labels=class_labels,
            feature_names=feature_names,
            framework=framework,
            framework_version=framework_version,
            metrics=dict(metrics or {}),
            input_profile=profile,
            missing_values=missing_values,
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            feature_views=dict(feature_views or {}),
            fallback=fallback,
            description=description,
            extra=extra,
            requires_promotion=requires_promotion,
        )
        return self._write_version(name, data, meta, version)

    def _latest_feature_names(self, name: str, inputs: list[TensorSpec]
                              ) -> tuple[list[str] | None, int | None]:
        """The newest version's feature names and its number, when this model's input has as
        many columns; else ``(None, None)``, with a warning when names are dropped."""
        versions = self.versions(name)
        if not versions:
            return None, None
        latest = versions[-1]
        try:
            names = self.metadata(name, latest).feature_names
        except CorruptModel:
            return None, None
        if not names:
            return None, None
        shape = inputs[0].shape if inputs else []
        width = shape[1] if len(shape) == 2 else None
        if width == len(names):
            return list(names), latest
        has = ("a variable number of columns" if width == -1 else f"{width} columns"
               if width is not None else f"shape {shape}")
        warnings.warn(
            f"version {latest} of '{name}' names its {len(names)} features, but this model's "
            f"input '{inputs[0].name if inputs else '?'}' has {has}, so the new version has no "
            "feature names (drift reports call its columns f0, f1, ...); pass its own names "
            "(--feature-names, or feature_names=) to keep them", RegistrationWarning, stacklevel=3)
        return None, None

    def add_estimator(
        self,
        name: str,
        estimator: Any,
        sample: Any,
        *,
        tolerance: float = 1e-4,
        feature_names: list[str] | None = None,
        **kwargs: Any,
    ) -> ModelMetadata:
        """Convert a framework model to ONNX (parity-checked on ``sample``) and add it.

        A Keras model may be its ``.keras`` path, a TensorFlow SavedModel its folder; the sample
        of a model with several inputs maps each input's name to its rows. ``task`` and
        ``class_labels`` override what the conversion found (a Keras classifier does not say)."""
        from collections.abc import Mapping

        import numpy as np

        from redline.models.convert import convert

        x: Any = sample if isinstance(sample, Mapping) else np.asarray(sample, dtype=np.float32)
        converted = convert(estimator, x, tolerance=tolerance)
        if feature_names is None:
            raw = getattr(estimator, "feature_names_in_", None)
            feature_names = [str(f) for f in raw] if raw is not None else None
        kwargs.setdefault("missing_values", "allow" if converted.handles_missing else "reject")
        labels = kwargs.pop("class_labels", None) or converted.class_labels
        task = kwargs.pop("task", None) or ("classification" if labels else converted.task)
        if isinstance(x, Mapping):  # the drift profile reads one table: a one-input model's
            x = next(iter(x.values())) if len(x) == 1 else None
        extra = dict(kwargs.pop("extra", None) or {})
        extra["conversion_max_abs_diff"] = converted.max_abs_diff
        return self.add_onnx(
            name,
            converted.onnx_bytes,
            task=task,
            class_labels=labels,
            feature_names=feature_names,
            framework=converted.framework,
            framework_version=converted.framework_version,
            sample=x,
            extra=extra,
            **kwargs,
        )

    def add_graph(
        self,
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
        import tempfile

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

            return add_dag(self, name, src, doc, version=version, description=description,
                           trust_code=trust_code, sample=sample, feature_names=feature_names,
                           feature_views=feature_views, timeout_s=timeout_s)
        if sample is not None or feature_names is not None:
            raise InvalidInput(f"{spec_path}: a recommender graph takes no --sample nor "
                               "--feature-names (its steps name what they read)")
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
                return self._add_python_graph(name, src, spec, cat, files, info, version,
                                              description)
            meta = ModelMetadata(
                name=name, version=0, inputs=inputs, outputs=outputs,
                sha256=hashlib.sha256(data).hexdigest(), task="regression",
                feature_names=list(spec.rank_features), framework="graph",
                created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                description=description, missing_values="allow",
                extra={"graph": spec.to_dict(), "catalogue": info},
            )
            return self._write_version(name, data, meta, version, files)

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
        return self._write_version(name, None, meta, version, files)

    def _add_python_graph(self, name: str, src: Path, spec: Any, cat: Any,
                          files: dict[str, Path], info: dict[str, Any], version: int | None,
                          description: str) -> ModelMetadata:
        """A graph whose ranker is Python: the graph's files and ``model.py`` in one folder,
        added as a Python model (checked on rows of the rank features) that carries the graph."""
        import tempfile

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
                    self, name, staged, g.rank_sample(spec, cat), trust_code=True,
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

    def _write_version(
        self, name: str, data: bytes | None, meta: ModelMetadata, version: int | None,
        files: dict[str, Path] | None = None,
    ) -> ModelMetadata:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        self._sweep_temporaries(folder)
        tmp = folder / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir()
            if data is not None:
                _write_durably(tmp / MODEL_FILE, data)
            for file_name, path in (files or {}).items():
                (tmp / file_name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, tmp / file_name)
            for _attempt in range(100):
                number = version if version is not None else max(self.versions(name), default=0) + 1
                meta.version = number
                _write_durably(tmp / METADATA_FILE, _dumps(meta.to_dict()))
                target = folder / str(number)
                try:
                    os.rename(tmp, target)  # atomic: the version appears whole or not at all
                except OSError as exc:
                    if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                        if version is not None:
                            raise RepositoryError(
                                f"model '{name}' already has version {version}; choose another "
                                "number or omit --version to take the next one"
                            ) from exc
                        continue  # another writer took this number: take the next one
                    raise
                _fsync_dir(folder)
                return meta
            raise RepositoryError(f"could not allocate a version number for model '{name}'")
        except OSError as exc:
            reason = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
            raise RepositoryError(
                f"could not write model '{name}' to {folder}: {reason}; nothing was added"
            ) from exc
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _sweep_temporaries(folder: Path) -> None:
        """Remove temporary folders left by writers that died (their pid no longer runs)."""
        for p in folder.glob(f"{_TMP_PREFIX}*"):
            pid_text = p.name[len(_TMP_PREFIX) :].split("-", 1)[0]
            if pid_text.isdigit() and not _pid_alive(int(pid_text)):
                shutil.rmtree(p, ignore_errors=True)

    def remove(self, name: str, version: int | str, *, force: bool = False) -> int:
        number = self.resolve(name, version)
        pinned = [a for a, v in self.aliases(name).items() if v == number]
        if pinned and not force:
            raise RepositoryError(
                f"version {number} of '{name}' is the target of alias(es) {pinned}; promote "
                "another version first or pass --force"
            )
        target = self.version_dir(name, number)
        trash = target.with_name(f"{_TMP_PREFIX}{os.getpid()}-rm-{number}")
        os.rename(target, trash)  # disappears atomically, then is deleted
        shutil.rmtree(trash, ignore_errors=True)
        if pinned:
            with self._edit_aliases(name) as aliases:
                for alias in pinned:
                    aliases.pop(alias, None)
        return number

    def promote(self, name: str, version: int | str, alias: str = "production") -> int:
        check_name(alias, "alias")
        if alias == "latest":
            raise InvalidInput("'latest' is reserved: it always means the newest version")
        number = self.resolve(name, version)
        with self._edit_aliases(name) as aliases:
            entry = aliases.setdefault(alias, {"version": number, "history": []})
            if entry["version"] != number:
                entry["history"].append(entry["version"])
                entry["version"] = number
        return number

    def rollback(self, name: str, alias: str = "production") -> int:
        self._require_model(name)
        with self._edit_aliases(name) as aliases:
            entry = aliases.get(alias)
            if not entry or not entry["history"]:
                raise RepositoryError(
                    f"alias '{alias}' of model '{name}' has no earlier version to roll back to"
                )
            entry["version"] = entry["history"].pop()
            return int(entry["version"])

    def set_policy(self, name: str, policy: VersionPolicy) -> None:
        self._require_model(name)
        _write_durably(self.root / name / POLICY_FILE, _dumps(policy.to_dict()), atomic=True)

    # ----------------------------------------------------------------- internals
    def _read_aliases(self, name: str) -> dict[str, dict[str, Any]]:
        path = self.root / name / ALIASES_FILE
        if not path.is_file():
            return {}
        try:
            data: dict[str, dict[str, Any]] = json.loads(path.read_text())
        except ValueError as exc:
            raise CorruptModel(f"aliases file {path} is not valid JSON; fix or delete it") from exc
        return data

    @contextlib.contextmanager
    def _edit_aliases(self, name: str) -> Iterator[dict[str, dict[str, Any]]]:
        aliases = self._read_aliases(name)
        yield aliases
        _write_durably(self.root / name / ALIASES_FILE, _dumps(aliases), atomic=True)


def _read_source(source: bytes | str | os.PathLike[str]) -> tuple[bytes, str]:
    if isinstance(source, bytes | bytearray):
        return bytes(source), "the given model bytes"
    path = Path(source)
    try:
        return path.read_bytes(), str(path)
    except FileNotFoundError as exc:
        raise InvalidInput(f"model file {path} does not exist") from exc
    except OSError as exc:
        raise InvalidInput(f"cannot read model file {path}: {exc.strerror}") from exc


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"


def _write_durably(path: Path, data: bytes, *, atomic: bool = False) -> None:
    target = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.part") if atomic else path
    try:
        with target.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if atomic:
            os.replace(target, path)
    finally:
        if atomic and target.exists():
            target.unlink()


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
