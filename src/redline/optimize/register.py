"""Store the chosen candidate in the repository, with how it was made and what it measured.

Registration is not deployment: the new version is written with ``requires_promotion``, so it
is not served by default, not loaded by a ``latest`` version policy, and not picked up by the
next ``optimize`` run, until ``redline gate --promote production`` or ``redline models
promote`` points an alias at it.

As a new version of the same model (the default), or as a separate fallback model that the
server routes to when the budget is short: then a new version of the original (same bytes) gets
``metadata.fallback`` pointing at it (``models.<name>.fallback`` in redline.yaml also works).
Either way ``metadata.extra["optimization"]`` says where it came from, by which technique and
settings, and its measured profile, so a reviewer can audit the numbers later.
"""

from __future__ import annotations

from typing import Any

from redline.errors import InvalidInput
from redline.models import ModelMetadata, ModelRepository
from redline.optimize.optimizer import CandidateResult, OptimizeReport
from redline.optimize.safety import nonfinite_weights


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
    bad, total = nonfinite_weights(result.candidate.onnx_bytes)
    if bad:  # the optimizer rejects these already; a second lock on the repository's door
        raise InvalidInput(f"refusing to register '{result.name}': {bad} of {total} weights "
                           "are NaN or infinite")
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
        missing_values=source.missing_values,  # every candidate kept the original's contract
        feature_views=source.feature_views,
        fallback=None if as_fallback else source.fallback,
        description=f"{result.name} of {source.name} v{source.version} ({result.note})",
        extra=extra,
        requires_promotion=not as_fallback,  # a fallback serves only via a promoted link
    )


def link_fallback(repo: ModelRepository, source: ModelMetadata, fallback: str) -> ModelMetadata:
    """A new version of the original — same ONNX bytes — whose ``metadata.fallback`` names the
    fallback model, so the server routes to it when the budget is short. Versions are immutable,
    so the link is a new version rather than an edit; aliases are left for the user to move."""
    data = repo.model_path(source.name, source.version).read_bytes()
    extra = dict(source.extra)
    extra["optimization"] = {"fallback_added": fallback, "same_model_as_version": source.version,
                             "tool": "redline optimize --as-fallback"}
    return repo.add_onnx(
        source.name, data, task=source.task, class_labels=source.class_labels,
        feature_names=source.feature_names, framework=source.framework,
        framework_version=source.framework_version, metrics=source.metrics,
        input_profile=source.input_profile, missing_values=source.missing_values,
        feature_views=source.feature_views, fallback=fallback,
        description=f"version {source.version} of {source.name} with fallback '{fallback}'",
        extra=extra,
        requires_promotion=True,
    )
