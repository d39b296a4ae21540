"""An MLflow pyfunc model served as a redline Python model.

``redline models add --from-mlflow URI --flavor pyfunc`` copies this file as the version's
``model.py``, the MLflow model into ``mlflow_model/`` beside it, and writes ``mlflow_io.json``:
how redline's tensors become the pyfunc's input and its answer becomes named outputs. The file
imports nothing from redline, so it reads (and runs) on its own.

``mlflow_io.json``::

    {"input": {"kind": "frame", "name": "input", "columns": ["a", "b"],
               "dtypes": ["float64", "int64"]},
     "outputs": [{"name": "output", "dtype": "int64"}]}

Input kinds: ``frame`` (one matrix, its columns become a DataFrame's), ``columns`` (one tensor
per DataFrame column), ``tensor`` (one array, passed as it is), ``tensors`` (a dict of arrays).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

MODEL_FOLDER = "mlflow_model"
IO_FILE = "mlflow_io.json"


class Model:
    """Loads the pyfunc from ``mlflow_model/`` and answers through its ``predict``."""

    def load(self, folder: str | Path) -> None:
        import mlflow.pyfunc

        self.io = json.loads((Path(folder) / IO_FILE).read_text())
        self.model = mlflow.pyfunc.load_model(str(Path(folder) / MODEL_FOLDER))

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return named_outputs(self.io, self.model.predict(pyfunc_input(self.io, inputs)))


def pyfunc_input(io: dict[str, Any], inputs: dict[str, np.ndarray]) -> Any:
    """redline's tensors as what the pyfunc was logged to take."""
    spec = io["input"]
    kind = spec["kind"]
    if kind == "tensor":
        return inputs[spec["name"]]
    if kind == "tensors":
        return {name: inputs[name] for name in spec["names"]}
    import pandas as pd

    if kind == "frame":
        matrix = inputs[spec["name"]]
        return pd.DataFrame({c: matrix[:, i].astype(d, copy=False)
                             for i, (c, d) in enumerate(zip(spec["columns"], spec["dtypes"],
                                                            strict=True))})
    return pd.DataFrame({c: _column(inputs[c], d)
                         for c, d in zip(spec["columns"], spec["dtypes"], strict=True)})


def _column(values: np.ndarray, dtype: str) -> Any:
    if dtype in ("str", "object"):  # strings may come as bytes off the wire
        return [v.decode() if isinstance(v, bytes) else str(v) for v in values.reshape(-1)]
    return values.reshape(-1).astype(dtype, copy=False)


def named_outputs(io: dict[str, Any], result: Any) -> dict[str, np.ndarray]:
    """The pyfunc's answer (array, list, Series, DataFrame or dict) as the declared outputs."""
    outputs = io["outputs"]
    if isinstance(result, dict):
        values = {o["name"]: result[o["name"]] for o in outputs}
    elif hasattr(result, "columns") and (len(outputs) > 1 or outputs[0]["name"] in result):
        values = {o["name"]: result[o["name"]] for o in outputs}
    else:
        values = {outputs[0]["name"]: result}
    return {o["name"]: _as_declared(values[o["name"]], o["dtype"]) for o in outputs}


def _as_declared(value: Any, dtype: str) -> np.ndarray:
    array = np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value)
    if array.ndim == 2 and array.shape[1] == 1 and hasattr(value, "columns"):
        array = array[:, 0]  # a one-column DataFrame answers one value per row
    if dtype == "object":
        return array.astype(object)
    return array.astype(dtype, copy=False)
