"""What the repository records about each model version (``metadata.json``).

Plain dataclasses: metadata is read once per load, never on the request path.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: V2 datatype name and shape (-1 is dynamic; dim 0 is the batch)."""

    name: str
    datatype: str
    shape: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(name=d["name"], datatype=d["datatype"], shape=[int(x) for x in d["shape"]])


@dataclass
class ModelMetadata:
    """Everything needed to serve, validate, monitor and audit one model version."""

    name: str
    version: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    sha256: str
    task: str = "regression"  # classification | regression
    class_labels: list[Any] | None = None
    feature_names: list[str] | None = None
    framework: str = "onnx"
    framework_version: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    input_profile: dict[str, Any] = field(default_factory=dict)
    missing_values: str = "reject"  # reject | allow (the model handles NaN itself)
    created_at: str = ""
    feature_views: dict[str, str] = field(default_factory=dict)  # view name -> view version
    fallback: str | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # True for versions made by tools (``redline optimize``): registered, but never served by
    # default or loaded by a ``latest`` policy until an alias (``production``) points at them.
    requires_promotion: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["inputs"] = [t.to_dict() for t in self.inputs]
        d["outputs"] = [t.to_dict() for t in self.outputs]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelMetadata:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        values["inputs"] = [TensorSpec.from_dict(t) for t in d["inputs"]]
        values["outputs"] = [TensorSpec.from_dict(t) for t in d["outputs"]]
        return cls(**values)


# The validation figures live quality compares a version's labelled predictions against
# (``monitoring/quality.py``), by task. A recorded name may say which split it was measured on:
# ``roc_auc_holdout`` and ``val_roc_auc`` are ``roc_auc``; ``roc_auc_train`` is no validation
# figure.
QUALITY_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("roc_auc", "accuracy", "log_loss"), "regression": ("rmse", "mae")}
_METRIC_ALIASES = {"auc": "roc_auc", "logloss": "log_loss"}
_SPLITS = ("validation", "valid", "val", "holdout", "heldout", "test", "eval")


def quality_metric_name(name: str) -> str | None:
    """The live-quality metric a recorded metric name stands for, or None."""
    tokens = [t for t in re.split(r"[^0-9a-z]+", name.lower()) if t]
    if len(tokens) > 1 and tokens[-1] in _SPLITS:
        tokens = tokens[:-1]
    elif len(tokens) > 1 and tokens[0] in _SPLITS:
        tokens = tokens[1:]
    base = "_".join(tokens)
    base = _METRIC_ALIASES.get(base, base)
    return base if any(base in names for names in QUALITY_METRICS.values()) else None


def validation_figures(metrics: dict[str, Any], task: str
                       ) -> tuple[dict[str, float], dict[str, str]]:
    """The figures live quality compares against, by its metric names, from a version's
    recorded ``metrics``; and, for every recorded metric it does not use, why not."""
    wanted = QUALITY_METRICS.get(task, ())
    figures: dict[str, float] = {}
    taken_from: dict[str, str] = {}
    unused: dict[str, str] = {}
    computes = (f"live quality computes {', '.join(wanted)} for a {task} model" if wanted
                else f"live quality compares no metric for a {task} model")
    # an exact name (``roc_auc``) before a qualified one (``roc_auc_holdout``)
    for name in sorted(metrics, key=lambda n: quality_metric_name(n) != n):
        value, metric = metrics[name], quality_metric_name(name)
        if metric is None or metric not in wanted:
            unused[name] = f"not a validation figure: {computes}"
        elif not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(
                value):
            unused[name] = f"{value!r} is not a finite number"
        elif metric in figures:
            unused[name] = f"the {metric} figure is '{taken_from[metric]}'"
        else:
            figures[metric], taken_from[metric] = float(value), name
    return figures, unused


def profile_inputs(
    sample: Any, feature_names: list[str] | None, bins: int = 10, max_categories: int = 20
) -> dict[str, Any]:
    """Per-feature quantiles and a histogram of the training inputs, kept for drift detection."""
    import numpy as np

    x = np.asarray(sample, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        return {}
    names = feature_names or [f"f{i}" for i in range(x.shape[1])]
    qs = [0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0]
    profile: dict[str, Any] = {"rows": int(x.shape[0]), "quantile_levels": qs, "features": {}}
    for i, name in enumerate(names):
        col = x[:, i]
        finite = col[np.isfinite(col)]
        if finite.size == 0:
            profile["features"][name] = {"missing_share": 1.0}
            continue
        edges = np.unique(np.quantile(finite, np.linspace(0, 1, bins + 1)))
        counts, _ = (
            np.histogram(finite, bins=edges) if edges.size > 1 else (np.array([finite.size]), edges)
        )
        profile["features"][name] = {
            "mean": float(finite.mean()),
            "std": float(finite.std()),
            "quantiles": [float(v) for v in np.quantile(finite, qs)],
            "histogram": {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]},
            "missing_share": float(1 - finite.size / col.size),
        }
        # A low-cardinality integer column is taken as categorical: drift compares its shares.
        values, value_counts = np.unique(finite, return_counts=True)
        integer = bool(np.all(values == np.round(values)))
        if integer:
            profile["features"][name]["integer"] = True
        if values.size <= max_categories and integer:
            shares = value_counts / finite.size
            profile["features"][name]["categories"] = {
                str(int(v)): float(c) for v, c in zip(values, shares, strict=True)
            }
    return profile
