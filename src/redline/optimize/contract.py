"""What a candidate must keep of the original to be a candidate at all: its contract.

Clients send inputs by name, dtype and shape and read outputs by name and dtype; a model that
accepts missing values (``missing_values: allow``) answers rows with NaN that another would
refuse. A candidate that changes any of these is a different product, however fast, so it is
never measured as valid, and the report prints the contract every candidate kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from redline.optimize.profile import ModelRunner


@dataclass(frozen=True)
class Contract:
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]  # name, ONNX type, shape (-1: any)
    outputs: tuple[tuple[str, str], ...]  # name, ONNX type
    missing_values: str  # allow | reject

    def describe(self) -> str:
        ins = ", ".join(f"{n} {_dtype(t)} {list(s)}" for n, t, s in self.inputs)
        outs = ", ".join(f"{n} {_dtype(t)}" for n, t in self.outputs)
        return f"inputs {ins}; outputs {outs}; missing values: {self.missing_values}"

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [{"name": n, "type": _dtype(t), "shape": list(s)}
                           for n, t, s in self.inputs],
                "outputs": [{"name": n, "type": _dtype(t)} for n, t in self.outputs],
                "missing_values": self.missing_values}


def io_contract(runner: ModelRunner, missing_values: str) -> Contract:
    """The contract as the model's session states it (the missing-value policy is given)."""
    session = runner.session
    inputs = tuple((i.name, i.type, tuple(d if isinstance(d, int) else -1 for d in i.shape))
                   for i in session.get_inputs())
    outputs = tuple((o.name, o.type) for o in session.get_outputs())
    return Contract(inputs, outputs, missing_values)


def missing_value_probe(x: np.ndarray, rows: int = 8) -> np.ndarray:
    """Rows with one missing value each, in every column, and one row missing everything: what
    a model that allows missing values must answer."""
    x = np.asarray(x, dtype=np.float32)
    finite = x[np.isfinite(x).all(axis=1)][:rows]
    base = finite if len(finite) else np.zeros((1, x.shape[1]), dtype=np.float32)
    probe = np.repeat(base, -(-x.shape[1] // len(base)), axis=0)[:x.shape[1]].copy()
    probe[np.arange(x.shape[1]), np.arange(x.shape[1])] = np.nan
    return np.concatenate([probe, np.full((1, x.shape[1]), np.nan, dtype=np.float32)])


def contract_breaks(original: Contract, candidate: ModelRunner, probe: np.ndarray | None,
                    answered: np.ndarray | None) -> str | None:
    """Why ``candidate`` breaks ``original``'s contract, or None when it keeps it.

    ``answered``: on each ``probe`` row, whether the original answers a number; a candidate
    that keeps ``missing_values: allow`` answers a number wherever the original does.
    """
    mine = io_contract(candidate, original.missing_values)
    changes = []
    if mine.inputs != original.inputs:
        changes.append(f"inputs {_list(original.inputs)} -> {_list(mine.inputs)}")
    if mine.outputs != original.outputs:
        changes.append(f"outputs {_list(original.outputs)} -> {_list(mine.outputs)}")
    if not changes and original.missing_values == "allow" and probe is not None \
            and answered is not None and answered.any():
        scores = candidate.predict(probe).scores
        ok = np.isfinite(scores.reshape(len(scores), -1)).all(axis=1)
        lost = int((answered & ~ok).sum())
        if lost:
            changes.append(f"missing values allow -> reject (answers NaN on {lost} of "
                           f"{int(answered.sum())} rows with a missing value that the original "
                           "answers)")
    return "; ".join(changes) or None


def answers_rows(runner: ModelRunner, probe: np.ndarray) -> np.ndarray:
    scores = runner.predict(probe).scores
    return np.asarray(np.isfinite(scores.reshape(len(scores), -1)).all(axis=1))


_NUMPY_NAMES = {"float": "float32", "double": "float64"}


def _dtype(onnx_type: str) -> str:
    name = onnx_type.removeprefix("tensor(").removesuffix(")")
    return _NUMPY_NAMES.get(name, name)


def _list(items: tuple[Any, ...]) -> str:
    return "[" + ", ".join(f"{t[0]} {_dtype(t[1])}" + (f" {list(t[2])}" if len(t) > 2 else "")
                           for t in items) + "]"
