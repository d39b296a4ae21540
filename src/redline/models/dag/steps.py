"""What a graph's steps compute besides running models: Python functions, ensembles, cascades'
confidence and fallback rows. Plain numpy, shared by the server and by ``models add``'s sample
run, so both answer the same."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from redline.errors import InvalidInput, ModelError
from redline.models.dag.spec import ANSWERED_BY, Step
from redline.models.datatypes import V2_TO_NUMPY
from redline.models.metadata import TensorSpec
from redline.models.python.code import (
    describe_failure,
    forget,
    import_from_folder,
    user_traceback,
    where,
)
from redline.models.python.contract import BrokenSignature, OutputCheck

Arrays = dict[str, np.ndarray]
StepFunction = Callable[[Arrays], Arrays]
_counter = itertools.count(1)


def import_function(folder: Path, function: str, label: str) -> StepFunction:
    """``file.py:function`` of ``folder``, imported as a fresh package (so the file can import
    its siblings relatively); an error names the file, its line and the step (``label``)."""
    file, _, name = function.partition(":")
    path = folder / file
    if not path.is_file():
        raise InvalidInput(f"{label}: {path} does not exist; put {file} next to graph.yaml")
    try:
        module = import_from_folder(f"_redline_graph_{next(_counter)}", folder, path)
    except Exception as exc:  # noqa: BLE001 - the user's import may raise anything
        raise ModelError(f"{label}: cannot import {file}: {describe_failure(exc, folder)}; fix "
                         "the file", traceback=user_traceback(exc, folder)) from None
    found = getattr(module, name, None)
    if not callable(found):
        raise ModelError(f"{label}: {file} defines no function {name}(inputs); define it, "
                         "taking and returning a dict of name -> numpy array (rows first)")
    return found  # type: ignore[no-any-return]


def forget_function(func: StepFunction) -> None:
    """Drop a step function's modules from ``sys.modules`` (a retired version is collected)."""
    module = sys.modules.get(getattr(func, "__module__", "") or "")
    if module is not None and module.__name__.startswith("_redline_graph_"):
        forget(module)


def call_function(func: StepFunction, inputs: Mapping[str, np.ndarray], rows: int,
                  folder: Path, label: str,
                  check: OutputCheck | None = None) -> Arrays:
    """Run a Python step: its answer must be a dict of arrays with ``rows`` rows and no NaN
    (and exactly its declared outputs, when it declares them: ``check``). Any failure is a
    ``ModelError`` naming the step and the user's line."""
    try:
        outputs = func(dict(inputs))
    except Exception as exc:  # noqa: BLE001 - the user's function may raise anything
        raise ModelError(f"{label} raised {describe_failure(exc, folder)}",
                         traceback=user_traceback(exc, folder),
                         key=f"{type(exc).__name__}{where(exc, folder)}") from None
    if check is not None:
        try:
            return check(outputs, rows)
        except BrokenSignature as exc:
            said = str(exc).replace("predict returned", "it returned")
            raise ModelError(f"{label} broke its declared outputs: {said}",
                             key=exc.key) from None
    if not isinstance(outputs, dict):
        raise ModelError(f"{label} returned {type(outputs).__name__}; return a dict of output "
                         "name -> numpy array", key="not a dict")
    out: Arrays = {}
    for name, value in outputs.items():
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        if array.ndim == 0 or array.shape[0] != rows:
            raise ModelError(f"{label} returned '{name}' with shape {list(array.shape)} for "
                             f"{rows} rows; return rows first", key=f"rows of {name}")
        if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
            raise ModelError(f"{label} returned '{name}' with NaN or infinity", key=f"nan {name}")
        out[str(name)] = array
    return out


def confidence(values: np.ndarray) -> np.ndarray:
    """Each row's confidence: its largest value (a class probability), or the value itself for
    one column, or max(p, 1 - p) for a single probability per row."""
    if values.ndim == 1:
        v = values.astype(np.float64)
        return np.maximum(v, 1.0 - v)
    flat = values.reshape(values.shape[0], -1)
    if flat.shape[1] == 1:
        v = flat[:, 0].astype(np.float64)
        return np.maximum(v, 1.0 - v)
    return np.asarray(flat.max(axis=1), dtype=np.float64)


def combine(step: Step, answers: list[Arrays]) -> Arrays:
    """An ensemble's answer from its members' (same order as ``step.members``)."""
    name = step.output
    arrays = [a[name] for a in answers]
    if step.method == "vote":
        return _vote(name, arrays)
    stacked = np.stack([np.asarray(a, dtype=np.float64) for a in arrays])
    weights = step.weights or [1.0] * len(arrays)
    mean = np.tensordot(np.asarray(weights) / sum(weights), stacked, axes=1)
    dtype = arrays[0].dtype if arrays[0].dtype.kind == "f" else np.dtype(np.float32)
    return {name: mean.astype(dtype)}


def _vote(name: str, arrays: list[np.ndarray]) -> Arrays:
    """Class probabilities (rows x classes): each member votes its top class; the answer is the
    share of votes per class and ``label``, the winner (ties: the lowest class). Labels (one
    per row): the most common, ties to the first member's."""
    first = arrays[0]
    if first.ndim == 2 and first.shape[1] > 1:
        classes = first.shape[1]
        shares = np.zeros((first.shape[0], classes), dtype=np.float32)
        for a in arrays:
            shares[np.arange(a.shape[0]), a.argmax(axis=1)] += 1.0
        shares /= len(arrays)
        return {name: shares, "label": shares.argmax(axis=1).astype(np.int64)}
    stacked = np.stack([a.reshape(a.shape[0]) for a in arrays], axis=1)
    out = first.reshape(first.shape[0]).copy()
    for r in range(stacked.shape[0]):
        values, counts = np.unique(stacked[r], return_counts=True)
        best = counts.max()
        if counts[list(values).index(out[r])] < best:
            out[r] = values[counts.argmax()]
    return {name: out}


def combined_specs(step: Step, member: list[TensorSpec] | None) -> list[TensorSpec] | None:
    """An ensemble's outputs given a member's (None: not known before a run)."""
    if member is None:
        return None
    spec = next((t for t in member if t.name == step.output), None)
    if spec is None:
        return None
    datatype = spec.datatype if spec.datatype.startswith("FP") else "FP32"
    if step.method != "vote":
        return [TensorSpec(spec.name, datatype, list(spec.shape))]
    if len(spec.shape) == 2 and spec.shape[1] != 1:
        return [TensorSpec(spec.name, "FP32", list(spec.shape)),
                TensorSpec("label", "INT64", [-1])]
    return [spec]


def cascade_specs(members: list[list[TensorSpec] | None]) -> list[TensorSpec] | None:
    """A cascade's outputs: those every member has alike, and ``answered_by``."""
    if any(m is None for m in members):
        return None
    first = members[0] or []
    common = [t for t in first if all(any(o == t for o in (m or [])) for m in members[1:])]
    return [*common, TensorSpec(ANSWERED_BY, "BYTES", [-1])]


def constant_rows(values: dict[str, Any], specs: list[TensorSpec] | None, rows: int,
                  label: str) -> Arrays:
    """A fallback's constant answer: each output's row repeated ``rows`` times, in the
    output's declared dtype when known."""
    known = {t.name: t for t in specs or []}
    out: Arrays = {}
    for name, row in values.items():
        spec = known.get(name)
        if spec is not None:
            dtype = V2_TO_NUMPY[spec.datatype]
        else:
            probe = np.asarray(row)
            dtype = (np.dtype(np.float32) if probe.dtype.kind == "f" else
                     np.dtype(np.int64) if probe.dtype.kind in "iu" else probe.dtype)
            if probe.dtype.kind in "US":
                dtype = np.dtype(object)
        try:
            one = np.asarray(row, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"{label}: fallback value of '{name}' is not a "
                               f"{dtype} row ({exc})") from None
        out[name] = np.repeat(one[np.newaxis, ...], rows, axis=0)
    return out
