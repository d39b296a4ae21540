"""ONNX versions: an ONNX file checked and stored, or a framework model (scikit-learn, LightGBM,
XGBoost, PyTorch, Keras/TensorFlow) converted to ONNX, parity-checked on a sample, and stored.

A retrained model keeps the feature names of the version before it when its input is as wide;
what is stored, but not quite as asked, is said with a ``RegistrationWarning``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redline.errors import CorruptModel, InvalidInput
from redline.models.metadata import (
    QUALITY_METRICS,
    ModelMetadata,
    TensorSpec,
    profile_inputs,
    validation_figures,
)
from redline.models.onnxfile import inspect_onnx
from redline.models.repository.layout import check_name

if TYPE_CHECKING:
    from redline.models.repository.model_repository import ModelRepository


class RegistrationWarning(UserWarning):
    """A version was added, but not quite as asked: names dropped, no validation figure."""


def add_onnx(
    repo: ModelRepository,
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
        feature_names, names_from = _latest_feature_names(repo, name, inputs)
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
    return repo.write_version(name, data, meta, version)


def add_estimator(
    repo: ModelRepository,
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
    return add_onnx(
        repo,
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


def _latest_feature_names(repo: ModelRepository, name: str, inputs: list[TensorSpec]
                          ) -> tuple[list[str] | None, int | None]:
    """The newest version's feature names and its number, when this model's input has as
    many columns; else ``(None, None)``, with a warning when names are dropped."""
    versions = repo.versions(name)
    if not versions:
        return None, None
    latest = versions[-1]
    try:
        names = repo.metadata(name, latest).feature_names
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
