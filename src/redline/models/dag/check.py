"""``models add`` of a general graph: every step's signature checked, a sample run, a version.

What a step returns is known before any run for models (their ONNX file or repository metadata),
ensembles and cascades (from their members) and Python steps that declare ``outputs``; each
step input is checked against the model it feeds (datatype, rank, fixed sizes). What is known
only from a run (an undeclared Python step) is read off the sample run, which also runs every
step once. Each refusal is one line naming the step and the fix.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.errors import InvalidInput, ModelError, RedlineError
from redline.models.dag.execute import GraphRun
from redline.models.dag.runner import GRAPH_FILE, DagRunner, DirectEnv, model_source
from redline.models.dag.spec import DEGRADED, DagSpec, Step, parse_dag, split_ref
from redline.models.dag.steps import (
    cascade_specs,
    combined_specs,
    forget_function,
    import_function,
)
from redline.models.datatypes import NUMPY_TO_V2
from redline.models.metadata import ModelMetadata, TensorSpec

if TYPE_CHECKING:
    from redline.models.repository import ModelRepository

Signatures = dict[str, list[TensorSpec] | None]
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


def add_dag(repo: ModelRepository, name: str, src: Path, doc: Any, *,
            version: int | None = None, description: str = "", trust_code: bool = False,
            sample: Any = None, feature_names: list[str] | None = None,
            feature_views: dict[str, str] | None = None, timeout_s: float = 60.0
            ) -> ModelMetadata:
    """Check a general graph folder and store it as a new version, atomically.

    ``feature_names`` (and the pinned ``feature_views``) name the columns of a one-input
    graph's rows, as a model's do, so ``/v1`` can serve it after features; the sample run is
    refused after ``timeout_s``."""
    origin = str(src / GRAPH_FILE)
    spec = parse_dag(doc, origin)
    for reserved in ("model.onnx", "model.py"):  # a version holding one is that kind of model
        if (src / reserved).exists():
            raise InvalidInput(f"{origin}: the folder holds {reserved}, which would make the "
                               "version a single model; rename it and name it in its step")
    _check_trust(spec, origin, trust_code)
    sigs, bindings = signatures(spec, src, origin, repo)
    repository_inputs = {
        step.name: [t.to_dict() for t in _model_signature(step, src, "", repo)[0]]
        for step in spec.steps.values() if step.kind == "model" and model_source(step)}
    meta = ModelMetadata(
        name=name, version=0, inputs=list(spec.inputs), outputs=[], sha256="",
        framework="graph", missing_values="allow", description=description,
        feature_names=feature_names, feature_views=dict(feature_views or {}),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    with tempfile.TemporaryDirectory(prefix="redline-graph-") as tmp:
        staged = Path(tmp) / "graph"
        shutil.copytree(src, staged, ignore=_SKIP)
        files = {p.relative_to(staged).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                 for p in sorted(staged.rglob("*")) if p.is_file()}
        meta.sha256 = files[GRAPH_FILE]
        meta.extra = {"dag": {"files": files, "bindings": bindings,
                              "signatures": _dump(sigs), "repository_inputs": repository_inputs}}
        if sample is not None:
            rows = _sample(spec, sample, origin)
            sigs = _sample_run(repo, meta, staged, spec, rows, sigs, origin, timeout_s)
            meta.extra["dag"]["signatures"] = _dump(sigs)
        meta.outputs = output_specs(spec, sigs, origin)
        return repo.write_files(name, meta, version, staged)


def _check_trust(spec: DagSpec, origin: str, trust_code: bool) -> None:
    from redline.models.python.add import TRUST_WARNING

    for step in spec.steps.values():
        code = step.function if step.kind == "python" else (
            step.model if step.kind == "model" and model_source(step) is None
            and not step.model.endswith(".onnx") else "")
        if code and not trust_code:
            raise InvalidInput(f"{origin}: step '{step.name}' runs Python code ({code}). "
                               f"{TRUST_WARNING} Pass --trust-code to add it.")


def signatures(spec: DagSpec, folder: Path, origin: str,
               repo: ModelRepository | None) -> tuple[Signatures, dict[str, dict[str, str]]]:
    """Each step's outputs (None: known only from a run), every model input bound and checked
    against what feeds it; the bindings (step -> model input -> ref) are recorded."""
    sigs: Signatures = {}
    bindings: dict[str, dict[str, str]] = {}
    graph_inputs = {t.name: t for t in spec.inputs}

    def produced(ref: str) -> TensorSpec | None:
        producer, output = split_ref(ref)
        if not producer:
            return graph_inputs[output]
        known = sigs.get(producer)
        return next((t for t in known if t.name == output), None) if known else None

    for name in _members_first(spec):
        step = spec.steps[name]
        where = f"{origin}: step '{name}'"
        if step.kind == "model":
            ins, outs = _model_signature(step, folder, where, repo)
            step.inputs = bind(step, ins, where)
            bindings[name] = dict(step.inputs)
            for spec_in in ins:
                got = produced(step.inputs[spec_in.name])
                if got is not None and not compatible(got, spec_in):
                    raise InvalidInput(
                        f"{where}: input '{spec_in.name}' reads {step.inputs[spec_in.name]} "
                        f"({got.datatype} {got.shape}) but {step.model} expects "
                        f"{spec_in.datatype} {spec_in.shape}; make the producer return that "
                        "(or cast it in a python step)")
            sigs[name] = outs
        elif step.kind == "python":
            # a syntax or import error is refused here, before anything runs
            forget_function(import_function(folder, step.function, where))
            sigs[name] = step.outputs
        elif step.kind == "ensemble":
            first = sigs[step.members[0]]
            for m in step.members:
                known = sigs[m]
                if known is not None and not any(t.name == step.output for t in known):
                    raise InvalidInput(f"{where}: step '{m}' has no output '{step.output}' "
                                       f"(outputs: {[t.name for t in known]}); name an output "
                                       "every member has")
            sigs[name] = combined_specs(step, first)
        else:
            member_sigs = [sigs[m] for m in step.members]
            for m, known in zip(step.members, member_sigs, strict=True):
                if known is not None and not any(t.name == step.confidence for t in known):
                    raise InvalidInput(f"{where}: step '{m}' has no output '{step.confidence}' "
                                       f"(its confidence; outputs: {[t.name for t in known]})")
            sigs[name] = cascade_specs(member_sigs)
    readers = [(f"step '{s.name}'", ref) for s in spec.steps.values() for ref in s.refs()]
    for who, ref in [*readers, *((f"output '{o}'", r) for o, r in spec.outputs.items())]:
        producer, output = split_ref(ref)
        known = sigs.get(producer) if producer else None
        if known is not None and not any(t.name == output for t in known):
            raise InvalidInput(f"{origin}: {who} reads '{ref}' but step '{producer}' has no "
                               f"output '{output}' (outputs: {[t.name for t in known]}); read "
                               "one of those")
    for step in spec.steps.values():
        fb = step.fallback
        mine, theirs = sigs.get(step.name), sigs.get(fb.step) if fb and fb.step else None
        if mine is not None and theirs is not None:
            lacking = [t.name for t in mine if not any(o.name == t.name for o in theirs)]
            if lacking:
                raise InvalidInput(f"{origin}: step '{step.name}' falls back to step "
                                   f"'{fb.step}', which has no {lacking}; fall back to a step "  # type: ignore[union-attr]
                                   "with the same outputs, or to constant values")
    return sigs, bindings


def _members_first(spec: DagSpec) -> list[str]:
    """``spec.order`` with each cascade's members just before it."""
    out: list[str] = []
    for name in spec.order:
        step = spec.steps[name]
        if step.kind == "cascade":
            out += step.members
        out.append(name)
    return out


def bind(step: Step, model_inputs: list[TensorSpec], where: str) -> dict[str, str]:
    """The step's inputs by the model's input names: as named, or in order when the names are
    the refs' own and there are as many."""
    names = [t.name for t in model_inputs]
    if set(step.inputs) == set(names):
        return dict(step.inputs)
    if len(step.inputs) == len(names) and not set(step.inputs) & set(names):
        return dict(zip(names, step.inputs.values(), strict=True))
    missing = [n for n in names if n not in step.inputs]
    raise InvalidInput(f"{where}: {step.model} takes inputs {names} but the step gives "
                       f"{sorted(step.inputs)}; map them, e.g. inputs: {{{names[0]}: "
                       f"step.output}} (missing: {missing})")


def compatible(got: TensorSpec, want: TensorSpec) -> bool:
    """Same datatype and rank, and every fixed size equal (-1 matches any size)."""
    if got.datatype != want.datatype or len(got.shape) != len(want.shape):
        return False
    return all(a == b or a == -1 or b == -1 for a, b in zip(got.shape[1:], want.shape[1:],
                                                             strict=True))


def _model_signature(step: Step, folder: Path, where: str, repo: ModelRepository | None
                     ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    source = model_source(step)
    if source is not None:
        if repo is None:
            raise InvalidInput(f"{where}: repository model {step.model} needs a repository")
        try:
            meta = repo.metadata(source[0], source[1])
        except RedlineError as exc:
            raise InvalidInput(f"{where}: {exc.message}") from None
        return meta.inputs, meta.outputs
    path = folder / step.model
    if path.is_dir():
        from redline.models.python.code import declared_signature, forget, instantiate

        try:
            model, module = instantiate(path)
        except ModelError as exc:
            raise InvalidInput(f"{where}: {exc.message}; fix the file") from None
        declared = declared_signature(type(model), str(path / "model.py"))
        forget(module)
        if declared is None:
            raise InvalidInput(f"{where}: {path}/model.py declares no signature; give its "
                               "class inputs and outputs attributes")
        return declared
    if not path.is_file():
        raise InvalidInput(f"{where}: {path} does not exist; put the model next to "
                           f"{GRAPH_FILE} or name a repository model (model: NAME:VERSION)")
    from redline.models.onnxfile import inspect_onnx

    return inspect_onnx(path.read_bytes(), str(path))


def output_specs(spec: DagSpec, sigs: Signatures, origin: str) -> list[TensorSpec]:
    """The graph's outputs as a signature (plus ``degraded`` where a step may degrade)."""
    outs: list[TensorSpec] = []
    for out, ref in spec.outputs.items():
        producer, output = split_ref(ref)
        found: TensorSpec | None
        if not producer:
            found = next(t for t in spec.inputs if t.name == output)
        else:
            known = sigs.get(producer)
            found = next((t for t in known if t.name == output), None) if known else None
        if found is None:
            raise InvalidInput(f"{origin}: output '{out}' reads '{ref}', whose datatype and "
                               f"shape only a run shows: pass --sample ROWS, or declare step "
                               f"'{producer}''s outputs")
        outs.append(TensorSpec(out, found.datatype, list(found.shape)))
    if spec.has_fallback and DEGRADED not in spec.outputs:
        outs.append(TensorSpec(DEGRADED, "BYTES", [-1]))
    return outs


def _sample(spec: DagSpec, sample: Any, origin: str) -> dict[str, np.ndarray]:
    if not isinstance(sample, dict):
        if len(spec.inputs) != 1:
            raise InvalidInput(f"{origin}: the graph has inputs {[t.name for t in spec.inputs]}"
                               "; give the sample as an .npz with one array per input")
        sample = {spec.inputs[0].name: sample}
    missing = [t.name for t in spec.inputs if t.name not in sample]
    if missing:
        raise InvalidInput(f"{origin}: the sample has no {missing}; its arrays are "
                           f"{sorted(sample)}")
    return {t.name: np.asarray(sample[t.name]) for t in spec.inputs}


def _sample_run(repo: ModelRepository, meta: ModelMetadata, folder: Path, spec: DagSpec,
                rows: dict[str, np.ndarray], sigs: Signatures, origin: str,
                timeout_s: float) -> Signatures:
    """Run the graph once on the sample; what a step returned fills in what was unknown."""
    from redline.models.loading import load_runner

    meta.outputs = []
    runner = DagRunner(meta, folder, spec, None,
                       lambda name, version: load_runner(repo, name, version))
    seen: dict[str, dict[str, np.ndarray]] = {}
    env = DirectEnv(runner, seen)
    failure: list[BaseException] = []

    async def whole() -> None:
        checked = runner.validate(rows)
        count = len(next(iter(checked.values())))
        run = GraphRun(spec, sigs, runner.schedule, env, meta.name)
        await run.answer(checked, count)
        for step in spec.steps.values():  # a cascade's later steps run on the sample too
            if step.kind == "python" and step.name not in seen:
                await env.run(step, run.inputs_of(step), count)

    def main() -> None:
        try:
            asyncio.run(whole())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            failure.append(exc)

    # On a thread of its own, so that a step that hangs on the sample is refused in time
    # (the thread is left behind; the command ends).
    thread = threading.Thread(target=main, name="graph-sample", daemon=True)
    thread.start()
    thread.join(timeout_s)
    try:
        if thread.is_alive():
            raise ModelError(f"{origin}: the sample run did not finish within {timeout_s:g} s "
                             f"(steps that answered: {sorted(seen) or 'none'}); fix the step "
                             "that hangs, or raise --timeout")
        if failure:
            exc = failure[0]
            if isinstance(exc, RedlineError):
                raise type(exc)(f"{origin}: the sample run failed: {exc.message}") from None
            raise exc
    finally:
        if not thread.is_alive():
            runner.close()
    filled = dict(sigs)
    for name, out in seen.items():
        if filled.get(name) is None:
            filled[name] = [_observed(k, v) for k, v in out.items()]
    for name in spec.order:  # ensembles and cascades over steps known only now
        step = spec.steps[name]
        if filled.get(name) is None and step.kind == "ensemble":
            filled[name] = combined_specs(step, filled.get(step.members[0]))
        elif filled.get(name) is None and step.kind == "cascade":
            filled[name] = cascade_specs([filled.get(m) for m in step.members])
    return filled


def _observed(name: str, array: np.ndarray) -> TensorSpec:
    datatype = "BYTES" if array.dtype.kind in "USO" else NUMPY_TO_V2[array.dtype]
    return TensorSpec(name, datatype, [-1, *array.shape[1:]])


def _dump(sigs: Signatures) -> dict[str, Any]:
    return {k: None if v is None else [t.to_dict() for t in v] for k, v in sigs.items()}


def check_repository_steps(meta: ModelMetadata, spec: DagSpec, repo: ModelRepository) -> None:
    """At load: each repository model a step reads still takes the inputs it took at ``add``
    (a new default version with another signature would fail every request instead)."""
    recorded = meta.extra.get("dag", {}).get("repository_inputs", {})
    for name, specs in recorded.items():
        step = spec.steps[name]
        source = model_source(step)
        assert source is not None
        try:
            now = repo.metadata(source[0], source[1]).inputs
        except RedlineError as exc:
            raise InvalidInput(f"graph '{meta.name}' step '{name}': {exc.message}") from None
        then = [TensorSpec.from_dict(t) for t in specs]
        if [(t.name, t.datatype) for t in now] != [(t.name, t.datatype) for t in then] or not all(
                compatible(a, b) for a, b in zip(then, now, strict=True)):
            raise InvalidInput(
                f"graph '{meta.name}' step '{name}': repository model {step.model} now takes "
                f"{[(t.name, t.datatype, t.shape) for t in now]}, not the "
                f"{[(t.name, t.datatype, t.shape) for t in then]} the graph was added with; "
                "pin the step to a version (model: NAME:VERSION) or add the graph again")
