"""Building the candidates: each asked-for technique in turn, from the original's bytes.

A technique that fails is skipped with its reason (one broken technique must not sink the
run), and a candidate that is the original itself, run the same way, is skipped as nothing to
measure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redline.config import RuntimeSettings
from redline.errors import RedlineError
from redline.optimize.candidates import Candidate, Skipped, TuneContext
from redline.optimize.options import TECHNIQUES, Progress
from redline.optimize.profile import ModelRunner
from redline.optimize.prune import parameter_count


def build_candidates(model: bytes, ctx: TuneContext, techniques: list[str],
                     base: RuntimeSettings, bar: Progress
                     ) -> tuple[list[Candidate], list[Skipped]]:
    """The original and every candidate the techniques make of it, and what they skipped."""
    candidates: list[Candidate] = [Candidate("original", "original", model, note="as registered",
                                             n_parameters=parameters(model))]
    skipped: list[Skipped] = []
    bar.stage("building candidates", len(techniques))
    for technique in techniques:
        bar.stage(f"building: {technique}")
        built, before = len(candidates), len(skipped)
        try:
            for item in TECHNIQUES[technique](model, ctx):
                if isinstance(item, Skipped):
                    skipped.append(item)
                elif runs_as_original(item, model, base):
                    skipped.append(Skipped(item.name, item.technique, "the same model as the "
                                           "original, run the same way: nothing to measure"))
                else:
                    if item.n_parameters is None:
                        item.n_parameters = parameters(item.onnx_bytes)
                    candidates.append(item)
        except RedlineError as exc:
            skipped.append(Skipped(technique, technique, exc.message))
        except Exception as exc:  # one broken technique must not sink the whole run
            skipped.append(Skipped(technique, technique, f"{type(exc).__name__}: {exc}"))
        bar.advance(detail=f"{technique}: "
                    + (", ".join(c.name for c in candidates[built:]) or "no candidate")
                    + (f" ({len(skipped) - before} skipped)" if len(skipped) > before else ""))
    return candidates, skipped


def runs_as_original(cand: Candidate, model: bytes, base: RuntimeSettings) -> bool:
    """Same bytes under the same effective settings: the original itself, whatever its name."""
    return cand.onnx_bytes == model and cand.runtime_settings(base) == base


def runner_factory(cand: Candidate, task: str, labels: list[Any] | None,
                   base: RuntimeSettings) -> Callable[[], ModelRunner]:
    """What loads a candidate's session, under its own runtime settings."""
    def build() -> ModelRunner:
        return ModelRunner(cand.onnx_bytes, task=task, class_labels=labels,
                           settings=cand.runtime_settings(base), name=cand.name)
    return build


def parameters(data: bytes) -> int:
    import onnx

    return parameter_count(onnx.load_from_string(data))
