"""A general graph version, loaded: its steps' models and functions, ready to run.

The server wraps it in a graph handle (``serving/dag.py``) that runs each request's steps
through batchers within the budget; :meth:`DagRunner.run` runs the graph directly (``models
add``'s sample run, ``redline models predict``). Loading re-checks the spec (a version written
by hand is held to the same rules) and the files against the sha256 recorded at ``add``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from redline.config import RuntimeSettings
from redline.errors import CorruptModel, InvalidInput, ModelError
from redline.models.dag.execute import GraphRun, Schedule, StepEnv
from redline.models.dag.spec import DagSpec, Step, parse_dag
from redline.models.dag.steps import (
    StepFunction,
    call_function,
    forget_function,
    import_function,
)
from redline.models.metadata import ModelMetadata, TensorSpec
from redline.models.python.contract import OutputCheck
from redline.models.runner import ModelRunner

GRAPH_FILE = "graph.yaml"
RepositoryModel = Callable[[str, str | None], ModelRunner]


def model_source(step: Step) -> tuple[str, str | None] | None:
    """``(name, version)`` of a repository model step; None for a file of the graph's folder
    (``*.onnx``, or a folder holding ``model.py``, written ``scorer/``)."""
    ref = step.model
    if ref.endswith((".onnx", "/")) or "/" in ref:
        return None
    name, _, version = ref.partition(":")
    return name, version or None


def signatures_from(meta: ModelMetadata) -> dict[str, list[TensorSpec] | None]:
    recorded = meta.extra.get("dag", {}).get("signatures", {})
    return {k: None if v is None else [TensorSpec.from_dict(t) for t in v]
            for k, v in recorded.items()}


class DagRunner(ModelRunner):
    """A graph version: ``spec``, its Python functions, its in-folder models' runners."""

    platform = "ensemble"   # as Triton names a graph of steps
    backend = "redline"

    def __init__(self, metadata: ModelMetadata, folder: Path, spec: DagSpec,
                 settings: RuntimeSettings | None = None,
                 repository_model: RepositoryModel | None = None) -> None:
        super().__init__(metadata, settings)
        self.folder = folder
        self.spec = spec
        self.signatures = signatures_from(metadata)
        for name, bound in metadata.extra.get("dag", {}).get("bindings", {}).items():
            if name in spec.steps:  # model inputs by the model's names, as checked at add
                spec.steps[name].inputs = dict(bound)
        self.schedule = Schedule(spec)
        self.functions: dict[str, StepFunction] = {}
        self.checks: dict[str, OutputCheck] = {}   # Python steps that declare their outputs
        self.local: dict[str, ModelRunner] = {}   # in-folder model steps
        self.repository_model = repository_model
        self._repo_runners: dict[str, ModelRunner] = {}
        self._labels = {name: self.label(step) for name, step in spec.steps.items()}
        try:
            for step in spec.steps.values():
                label = self._labels[step.name]
                if step.kind == "python":
                    self.functions[step.name] = import_function(folder, step.function, label)
                    if step.outputs is not None:
                        self.checks[step.name] = OutputCheck(step.outputs)
                elif step.kind == "model" and model_source(step) is None:
                    self.local[step.name] = load_local_model(folder, step, metadata, settings)
        except BaseException:
            self.close()
            raise

    @classmethod
    def load(cls, metadata: ModelMetadata, folder: Path, settings: RuntimeSettings | None = None,
             repository_model: RepositoryModel | None = None) -> DagRunner:
        verify_files(metadata, folder)
        return cls(metadata, folder, read_spec(folder), settings, repository_model)

    def label(self, step: Step) -> str:
        return f"graph '{self.metadata.name}' step '{step.name}'"

    def call_python(self, step: Step, inputs: Mapping[str, np.ndarray],
                    rows: int) -> dict[str, np.ndarray]:
        """A Python step's outputs, checked (rows first, declared dtypes)."""
        return call_function(self.functions[step.name], inputs, rows, self.folder,
                             self._labels[step.name], self.checks.get(step.name))

    # ------------------------------------------------------------------ direct runs
    def run(self, inputs: Mapping[str, np.ndarray],
            output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The graph's outputs, every step run here in turn (no batching, no budget)."""
        first = next(iter(inputs.values()))
        rows = int(first.shape[0]) if first.ndim else 1
        run = GraphRun(self.spec, self.signatures, self.schedule, DirectEnv(self),
                       self.metadata.name)
        out = asyncio.run(run.answer(dict(inputs), rows))
        return {n: out[n] for n in output_names} if output_names else out

    def run_model(self, step: Step, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        runner = self.local.get(step.name)
        if runner is None:
            source = model_source(step)
            assert source is not None
            runner = self._repo_runners.get(step.name)
            if runner is None:
                if self.repository_model is None:
                    raise ModelError(f"{self.label(step)}: repository model {step.model} is "
                                     "not available here")
                runner = self._repo_runners[step.name] = self.repository_model(*source)
        return runner.run(runner.validate(inputs))

    def close(self) -> None:
        """Release the in-folder models (and those loaded for direct runs); once."""
        runners = [*self.local.values(), *self._repo_runners.values()]
        self.local, self._repo_runners = {}, {}
        for func in self.functions.values():
            forget_function(func)
        for runner in runners:
            runner.close()


class DirectEnv(StepEnv):
    """Steps run on the calling thread, one after another, with no budget; what each Python
    step returned is kept in ``seen`` when given (``models add`` reads unknown outputs off it)."""

    def __init__(self, runner: DagRunner,
                 seen: dict[str, dict[str, np.ndarray]] | None = None) -> None:
        self.runner = runner
        self.seen = seen

    async def run(self, step: Step, inputs: dict[str, np.ndarray],
                  rows: int) -> dict[str, np.ndarray]:
        if step.kind != "python":
            return self.runner.run_model(step, inputs)
        out = self.runner.call_python(step, inputs, rows)
        if self.seen is not None:
            self.seen[step.name] = out
        return out

    def skip_reason(self, step: Step) -> str | None:
        return None

    def observe(self, step: Step, start_ns: int, end_ns: int, ran: bool) -> None:
        pass


def read_spec(folder: Path) -> DagSpec:
    path = folder / GRAPH_FILE
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"{path} cannot be read as YAML ({exc})") from exc
    return parse_dag(doc, str(path))


def load_local_model(folder: Path, step: Step, graph: ModelMetadata,
                     settings: RuntimeSettings | None) -> ModelRunner:
    """An in-folder model step's runner: an ONNX file, or a folder holding ``model.py`` with
    its signature declared on its class."""
    from redline.models.onnxfile import inspect_onnx

    path = folder / step.model
    name = f"{graph.name}.{step.name}"
    if path.is_dir():
        from redline.models.python.code import declared_signature, forget, instantiate
        from redline.models.python.session import PythonSession

        model, module = instantiate(path)
        declared = declared_signature(type(model), str(path / "model.py"))
        forget(module)
        if declared is None:
            raise InvalidInput(f"graph '{graph.name}' step '{step.name}': {path}/model.py "
                               "declares no signature; give its class inputs and outputs "
                               "attributes")
        meta = ModelMetadata(name=name, version=graph.version, inputs=declared[0],
                             outputs=declared[1], sha256="", framework="python",
                             missing_values="allow")
        return PythonSession(meta, path, settings)
    if not path.is_file():
        raise InvalidInput(f"graph '{graph.name}' step '{step.name}': {path} does not exist")
    from redline.models.runtime import InferenceSession

    data = path.read_bytes()
    inputs, outputs = inspect_onnx(data, str(path))
    meta = ModelMetadata(name=name, version=graph.version, inputs=inputs, outputs=outputs,
                         sha256=hashlib.sha256(data).hexdigest(), missing_values="allow")
    return InferenceSession(data, meta, settings, origin=str(path))


def verify_files(metadata: ModelMetadata, folder: Path) -> None:
    """Every file recorded at ``add`` is there, unchanged."""
    files: dict[str, Any] = metadata.extra.get("dag", {}).get("files") or {}
    for name, expected in sorted(files.items()):
        path = folder / name
        try:
            actual = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as exc:
            raise CorruptModel(f"graph file {path} cannot be read ({exc.strerror}); add the "
                               "graph again") from exc
        if actual != expected:
            raise CorruptModel(f"graph file {path} does not match its recorded sha256: it was "
                               "modified or damaged after it was added; add the graph again")
