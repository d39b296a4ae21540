"""``graph.yaml`` of a general graph: named steps, what each reads, and the checks on its shape.

A step reads graph inputs (``text``) or other steps' outputs (``features.x``) and is one of four
kinds: ``model`` (an ONNX or Python model, from the repository or the graph's folder),
``python`` (a function ``file.py:function`` of dict -> dict), ``ensemble`` (mean, weighted mean
or vote over steps' outputs) and ``cascade`` (steps tried in order until one is sure enough).
Everything that can be said from the file alone is checked here (unknown kinds and steps,
missing inputs, cycles, thresholds); signatures are checked against the models in ``check.py``.
The format is documented in ``docs/graphs.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from redline.errors import InvalidInput
from redline.models.datatypes import V2_TO_NUMPY
from redline.models.metadata import TensorSpec

KINDS = ("model", "python", "ensemble", "cascade")
METHODS = ("mean", "weighted_mean", "vote")
ANSWERED_BY = "answered_by"   # a cascade's extra output: which step answered each row
DEGRADED = "degraded"         # a graph with fallbacks: why each row degraded ("" if it did not)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_STEP_KEYS = {
    "model": {"kind", "model", "inputs", "fallback"},
    "python": {"kind", "function", "inputs", "outputs", "batch", "fallback"},
    "ensemble": {"kind", "steps", "method", "output", "weights", "fallback"},
    "cascade": {"kind", "steps", "confidence", "threshold", "fallback"},
}


@dataclass
class Fallback:
    """What a step answers when it fails, runs out of time or would not fit the budget: another
    step's outputs (same names), or constant rows per output."""

    step: str | None = None
    values: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step} if self.step else {"value": self.values}


@dataclass
class Step:
    """One step of a graph (see ``docs/graphs.md`` for each key)."""

    name: str
    kind: str
    inputs: dict[str, str] = field(default_factory=dict)  # the step's input name -> a ref
    model: str = ""                # model: "file.onnx" in the folder, or "name" / "name:version"
    function: str = ""             # python: "file.py:function"
    batch: bool = False            # python: rows of concurrent requests in one call
    outputs: list[TensorSpec] | None = None   # python: declared outputs (None: unknown)
    members: list[str] = field(default_factory=list)       # ensemble, cascade
    thresholds: list[float] = field(default_factory=list)  # cascade: one per member but last
    confidence: str = ""           # cascade: the output whose row max is the confidence
    method: str = "mean"           # ensemble
    weights: list[float] = field(default_factory=list)     # ensemble: weighted_mean
    output: str = ""               # ensemble: the output of each member it combines
    fallback: Fallback | None = None

    def refs(self) -> list[str]:
        return list(self.inputs.values())


@dataclass
class DagSpec:
    """A checked general ``graph.yaml``; ``order`` runs every step after the steps it reads."""

    inputs: list[TensorSpec]
    steps: dict[str, Step]
    outputs: dict[str, str]        # the graph's output name -> a ref
    order: list[str] = field(default_factory=list)

    def members(self) -> dict[str, str]:
        """Steps that run only inside a cascade -> that cascade."""
        return {m: s.name for s in self.steps.values() if s.kind == "cascade" for m in s.members}

    @property
    def has_fallback(self) -> bool:
        return any(s.fallback is not None for s in self.steps.values()) or any(
            s.kind == "cascade" for s in self.steps.values())

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [t.to_dict() for t in self.inputs], "outputs": dict(self.outputs),
                "steps": list(self.steps)}


def is_dag(doc: Any) -> bool:
    """Whether a ``graph.yaml`` document is a general graph (its steps are a mapping of named
    steps with a ``kind``), not the recommender's fixed list (``docs/recommend.md``)."""
    if not isinstance(doc, dict):
        return False
    steps = doc.get("steps")
    if isinstance(steps, dict):
        return True
    return isinstance(steps, list) and any(isinstance(s, dict) and "kind" in s for s in steps)


def split_ref(ref: str) -> tuple[str, str]:
    """``("features", "x")`` for ``features.x``; ``("", "text")`` for a graph input."""
    step, dot, output = ref.partition(".")
    return (step, output) if dot else ("", ref)


def parse_dag(doc: Any, origin: str) -> DagSpec:
    """A general ``graph.yaml`` document as a :class:`DagSpec`; any mistake is one
    ``InvalidInput`` line naming the step and the fix."""
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), dict):
        raise InvalidInput(f"{origin}: 'steps' must be a mapping of step names to steps, like "
                           "'steps: {score: {kind: model, model: m.onnx, inputs: [x]}}'")
    unknown = sorted(set(doc) - {"inputs", "steps", "outputs"})
    if unknown:
        raise InvalidInput(f"{origin}: unknown key(s) {unknown}; a graph has inputs, steps and "
                           "outputs")
    inputs = _tensors(doc.get("inputs"), f"{origin}: inputs")
    if not inputs:
        raise InvalidInput(f"{origin}: declare the graph's inputs, like 'inputs: {{x: "
                           "{datatype: FP32, shape: [-1, 4]}}'")
    steps: dict[str, Step] = {}
    for name, body in doc["steps"].items():
        steps[str(name)] = _step(str(name), body, origin)
    raw_outputs = doc.get("outputs")
    if not isinstance(raw_outputs, dict) or not raw_outputs:
        raise InvalidInput(f"{origin}: declare the graph's outputs, like 'outputs: {{label: "
                           "post.label}}' (an output name -> step.output)")
    outputs = {str(k): str(v) for k, v in raw_outputs.items()}
    for out in outputs:
        _check_name(out, f"{origin}: output name", origin)
    spec = DagSpec(inputs, steps, outputs)
    _check_refs(spec, origin)
    spec.order = _order(spec, origin)
    return spec


def _step(name: str, body: Any, origin: str) -> Step:
    where = f"{origin}: step '{name}'"
    _check_name(name, f"{origin}: step name", origin)
    if not isinstance(body, dict) or "kind" not in body:
        raise InvalidInput(f"{where} needs a 'kind' ({', '.join(KINDS)})")
    kind = body["kind"]
    if kind not in KINDS:
        raise InvalidInput(f"{where}: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    extra = sorted(set(body) - _STEP_KEYS[kind])
    if extra:
        raise InvalidInput(f"{where}: unknown key(s) {extra} for a {kind} step (keys: "
                           f"{', '.join(sorted(_STEP_KEYS[kind]))})")
    step = Step(name, kind, inputs=_inputs(body.get("inputs"), where))
    if kind == "model":
        step.model = str(body.get("model") or "")
        if not step.model:
            raise InvalidInput(f"{where}: name its model: a file of the graph's folder "
                               "(model: m.onnx) or a repository model (model: fraud:3)")
        if step.model.endswith(".py"):
            raise InvalidInput(f"{where}: a Python model of the graph's folder is a folder "
                               "holding model.py (model: scorer/); a function is a python step "
                               "(kind: python, function: file.py:name)")
    elif kind == "python":
        step.function = str(body.get("function") or "")
        file, colon, func = step.function.partition(":")
        if not colon or not file.endswith(".py") or not func.isidentifier():
            raise InvalidInput(f"{where}: function must be 'file.py:function', got "
                               f"{step.function!r}")
        step.batch = bool(body.get("batch", False))
        if "outputs" in body:
            step.outputs = _tensors(body["outputs"], f"{where}: outputs")
    else:
        members = body.get("steps")
        if not isinstance(members, list) or len(members) < 2:
            raise InvalidInput(f"{where}: a {kind} lists at least two steps under 'steps'")
        if kind == "ensemble":
            _ensemble(step, body, members, where)
        else:
            _cascade(step, body, members, where)
    if "fallback" in body:
        step.fallback = _fallback(body["fallback"], where)
    return step


def _ensemble(step: Step, body: dict[str, Any], members: list[Any], where: str) -> None:
    step.members = [str(m) for m in members]
    step.method = str(body.get("method", "mean"))
    if step.method not in METHODS:
        raise InvalidInput(f"{where}: method must be one of {', '.join(METHODS)}, got "
                           f"{step.method!r}")
    step.output = str(body.get("output") or "")
    if not step.output:
        raise InvalidInput(f"{where}: name the output of each step it combines (output: "
                           "probabilities)")
    if step.method == "weighted_mean":
        weights = body.get("weights")
        if (not isinstance(weights, list) or len(weights) != len(members)
                or not all(_number(w) and w >= 0 for w in weights) or not sum(weights) > 0):
            raise InvalidInput(f"{where}: weighted_mean needs 'weights', one non-negative "
                               f"number per step ({len(members)}), not all zero")
        step.weights = [float(w) for w in weights]
    elif "weights" in body:
        raise InvalidInput(f"{where}: weights go with method: weighted_mean")


def _cascade(step: Step, body: dict[str, Any], members: list[Any], where: str) -> None:
    default = body.get("threshold")
    for i, m in enumerate(members):
        if isinstance(m, dict):
            if "step" not in m or set(m) - {"step", "threshold"}:
                raise InvalidInput(f"{where}: steps[{i}] must be a step name or "
                                   "{step: NAME, threshold: 0.9}")
            member, threshold = str(m["step"]), m.get("threshold", default)
        else:
            member, threshold = str(m), default
        step.members.append(member)
        if i == len(members) - 1:
            continue  # the last step answers whatever its confidence
        if not _number(threshold) or not 0 < float(threshold) <= 1:  # type: ignore[arg-type]
            raise InvalidInput(f"{where}: the threshold of '{member}' must be in (0, 1] (a "
                               f"confidence it must reach to answer), got {threshold!r}")
        step.thresholds.append(float(threshold))  # type: ignore[arg-type]
    step.confidence = str(body.get("confidence") or "")
    if not step.confidence:
        raise InvalidInput(f"{where}: name the output whose largest value per row is a step's "
                           "confidence (confidence: probabilities)")


def _fallback(value: Any, where: str) -> Fallback:
    if isinstance(value, dict) and set(value) == {"step"}:
        return Fallback(step=str(value["step"]))
    if isinstance(value, dict) and set(value) == {"value"} and isinstance(value["value"], dict):
        return Fallback(values=dict(value["value"]))
    raise InvalidInput(f"{where}: fallback must be {{step: NAME}} (that step's outputs) or "
                       "{value: {OUTPUT: ROW}} (a constant row per output)")


def _inputs(value: Any, where: str) -> dict[str, str]:
    """``{name: ref}``; a list of refs names each input after its ref's last part."""
    if value is None:
        return {}
    if isinstance(value, list):
        out: dict[str, str] = {}
        for ref in value:
            key = split_ref(str(ref))[1]
            if key in out:
                raise InvalidInput(f"{where}: two inputs are called '{key}'; write inputs as a "
                                   "mapping {input name: ref}")
            out[key] = str(ref)
        return out
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    raise InvalidInput(f"{where}: inputs must be a list of refs or a mapping {{input: ref}}")


def _tensors(value: Any, where: str) -> list[TensorSpec]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be a mapping like {{x: {{datatype: FP32, shape: "
                           "[-1, 4]}}}}")
    specs = []
    for name, body in value.items():
        if not isinstance(body, dict) or body.get("datatype") not in V2_TO_NUMPY:
            raise InvalidInput(f"{where}: '{name}' needs a datatype ({', '.join(V2_TO_NUMPY)})"
                               " and a shape")
        shape = body.get("shape", [-1])
        if (not isinstance(shape, list) or not shape or shape[0] != -1
                or not all(isinstance(d, int) and (d == -1 or d > 0) for d in shape)):
            raise InvalidInput(f"{where}: '{name}' shape must be rows first, like [-1] or "
                               f"[-1, 4] (-1: any size), got {shape!r}")
        specs.append(TensorSpec(str(name), str(body["datatype"]), list(shape)))
    return specs


def _check_name(name: str, what: str, origin: str) -> None:
    if not _NAME.match(name):
        raise InvalidInput(f"{what} {name!r} must be letters, digits, '_' or '-', starting with "
                           "a letter")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_refs(spec: DagSpec, origin: str) -> None:
    """Every ref names a graph input or a step's output; members and fallbacks exist."""
    graph_inputs = {t.name for t in spec.inputs}
    members: dict[str, str] = {}
    for step in spec.steps.values():
        for m in step.members:
            if m not in spec.steps:
                raise InvalidInput(f"{origin}: step '{step.name}' lists unknown step '{m}' "
                                   f"(steps: {', '.join(spec.steps)})")
            if m == step.name:
                raise InvalidInput(f"{origin}: step '{step.name}' lists itself")
            if step.kind == "cascade":
                if spec.steps[m].kind not in ("model", "python"):
                    raise InvalidInput(f"{origin}: cascade '{step.name}' lists '{m}', a "
                                       f"{spec.steps[m].kind} step; a cascade tries model and "
                                       "python steps")
                if m in members:
                    raise InvalidInput(f"{origin}: step '{m}' is in two cascades ('{members[m]}'"
                                       f" and '{step.name}'); a step runs in one at most")
                if spec.steps[m].fallback is not None:
                    raise InvalidInput(f"{origin}: step '{m}' runs in cascade '{step.name}': "
                                       "declare the fallback on the cascade, not on its steps")
                members[m] = step.name
        if step.kind in ("model", "python") and not step.inputs:
            raise InvalidInput(f"{origin}: step '{step.name}' reads nothing: give it inputs "
                               "(graph inputs or step.output)")
        fb = step.fallback
        if fb is not None and fb.step is not None:
            if fb.step not in spec.steps or fb.step == step.name:
                raise InvalidInput(f"{origin}: step '{step.name}' falls back to unknown step "
                                   f"'{fb.step}'; name another step")
    readers = [(f"step '{s.name}'", ref) for s in spec.steps.values() for ref in s.refs()]
    readers += [(f"output '{o}'", ref) for o, ref in spec.outputs.items()]
    for who, ref in readers:
        producer, output = split_ref(ref)
        if not producer:
            if output not in graph_inputs:
                raise InvalidInput(f"{origin}: {who} reads '{ref}', which is no graph input "
                                   f"(inputs: {', '.join(sorted(graph_inputs))}); refer to a "
                                   "step's output as step.output")
            continue
        if producer not in spec.steps:
            raise InvalidInput(f"{origin}: {who} reads '{ref}' but there is no step "
                               f"'{producer}' (steps: {', '.join(spec.steps)})")
        if producer in members:
            raise InvalidInput(f"{origin}: {who} reads '{ref}', but '{producer}' runs only "
                               f"inside cascade '{members[producer]}': read "
                               f"'{members[producer]}.{output}' instead")
    for step in spec.steps.values():
        if step.kind == "ensemble":
            for m in step.members:
                if m in members:
                    raise InvalidInput(f"{origin}: ensemble '{step.name}' lists '{m}', which "
                                       f"runs only inside cascade '{members[m]}'; list the "
                                       "cascade instead")
        fb = step.fallback
        if fb is not None and fb.step is not None and fb.step in members:
            raise InvalidInput(f"{origin}: step '{step.name}' falls back to '{fb.step}', which "
                               f"runs only inside cascade '{members[fb.step]}'; fall back to "
                               "the cascade")


def dependencies(spec: DagSpec, step: Step) -> list[str]:
    """The steps that must finish before ``step`` starts (a cascade: what its members read)."""
    refs = list(step.refs())
    if step.kind == "cascade":
        for m in step.members:
            refs += spec.steps[m].refs()
    deps = [split_ref(r)[0] for r in refs]
    if step.kind == "ensemble":
        deps += step.members
    if step.fallback is not None and step.fallback.step is not None:
        deps.append(step.fallback.step)
    return list(dict.fromkeys(d for d in deps if d))


def _order(spec: DagSpec, origin: str) -> list[str]:
    """The steps the outputs need, each after what it reads; a cycle is refused, naming it."""
    members = spec.members()
    graph = {name: dependencies(spec, s) for name, s in spec.steps.items() if name not in members}
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            raise InvalidInput(f"{origin}: steps form a cycle ({' -> '.join(cycle)}); a step "
                               "cannot read, directly or through others, its own output")
        state[name] = 1
        for dep in graph[name]:
            visit(members.get(dep, dep), [*path, name])
        state[name] = 2
        order.append(name)

    for name in graph:
        visit(name, [])
    needed: set[str] = set()
    todo = [split_ref(r)[0] for r in spec.outputs.values()]
    while todo:
        name = todo.pop()
        if name and name not in needed:
            needed.add(name)
            todo += graph.get(name, [])
    unused = [n for n in graph if n not in needed]
    if unused:
        raise InvalidInput(f"{origin}: step '{unused[0]}' feeds no output; read it in "
                           "'outputs' or another step, or remove it")
    return order
