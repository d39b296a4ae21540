"""Store the chosen candidate in the repository, with how it was made and what it measured.

As a new version of the same model (the default), or as a separate fallback model that the
server can route to when the budget is short (``models.<name>.fallback`` in redline.yaml).
Either way ``metadata.extra["optimization"]`` says where it came from, by which technique and
settings, and its measured profile, so a reviewer can audit the numbers later.
"""

from __future__ import annotations

from typing import Any

from redline.models import ModelMetadata, ModelRepository
from redline.optimize.optimizer import CandidateResult, OptimizeReport


def register_candidate(
    repo: ModelRepository,
    source: ModelMetadata,
    report: OptimizeReport,
    result: CandidateResult,
    *,
    as_fallback: bool = False,
    fallback_name: str | None = None,
) -> ModelMetadata:
    assert result.candidate is not None
    target = (fallback_name or f"{source.name}-fast") if as_fallback else source.name
    optimization: dict[str, Any] = {
        "source": {"model": source.name, "version": source.version, "sha256": source.sha256},
        "candidate": result.name,
        "technique": result.technique,
        "recipe": result.recipe,
        "note": result.note,
        "metric": report.metric,
        "tolerance": report.tolerance,
        "evaluation_rows": report.eval_rows,
        "tuning_rows": report.tune_rows,
        "profile": result.profile(),
        "original_profile": report.result("original").profile(),
        "tool": "redline optimize",
    }
    if as_fallback:
        optimization["fallback_for"] = source.name
    extra: dict[str, Any] = {"optimization": optimization}
    if result.settings:
        extra["runtime"] = dict(result.settings)  # recommended ONNX Runtime settings
    missing = source.missing_values
    if result.technique == "distill":
        missing = "reject"  # an MLP student turns NaN into NaN: it must not accept missing values
    return repo.add_onnx(
        target,
        result.candidate.onnx_bytes,
        task=source.task,
        class_labels=source.class_labels,
        feature_names=source.feature_names,
        framework=source.framework,
        framework_version=source.framework_version,
        metrics={k: float(v) for k, v in result.metrics.items()},
        input_profile=source.input_profile,
        missing_values=missing,
        feature_views=source.feature_views,
        fallback=None if as_fallback else source.fallback,
        description=f"{result.name} of {source.name} v{source.version} ({result.note})",
        extra=extra,
    )
