"""An MLflow pyfunc as a redline Python model: ``model.py`` (``mlflow_pyfunc_model``), the MLflow
model in ``mlflow_model/`` and ``mlflow_io.json``, added through ``add_python``.

The signature comes from MLflow's: numeric columns become one matrix ``input`` named by the
columns (FP64 where a column needs it), a table with strings one tensor per column, tensors keep
their names; outputs are MLflow's (an unnamed one is ``output``), or, without an output schema,
what the model answers on the sample.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.errors import ConversionError, InvalidInput, RedlineError
from redline.models.convert.frameworks import import_framework
from redline.models.convert.mlflow_store import (
    MlflowModel,
    mlflow_scope,
    sample_word,
)

if TYPE_CHECKING:
    from redline.models.metadata import ModelMetadata
    from redline.models.repository import ModelRepository

_COLUMN_DTYPES = {"boolean": "bool", "integer": "int32", "long": "int64", "float": "float32",
                  "double": "float64", "string": "object", "binary": "object"}


def add_pyfunc(repo: ModelRepository, name: str, model: MlflowModel, sample: Any, tmp: Path, *,
               trust_code: bool, feature_names: list[str] | None = None,
               **kwargs: Any) -> ModelMetadata:
    """The pyfunc flavor as a Python model: ``model.py`` (``mlflow_pyfunc_model``) loads the MLflow
    model kept beside it; the signature comes from MLflow's, the sample from its input example."""
    from redline.models.convert import mlflow_pyfunc_model as model_py

    if not trust_code:
        raise InvalidInput(
            f"--from-mlflow {model.uri}: its pyfunc flavor becomes a Python model, which runs "
            "the MLflow model's own code here and in every server that serves it. Only import "
            "models you produced yourself; pass --trust-code to import it")
    spec, inputs, names = pyfunc_inputs(model, sample)
    rows = pyfunc_rows(model, spec, sample)
    io: dict[str, Any] = {"input": spec}
    if model.signature is not None and model.signature.outputs is not None:
        io["outputs"], outputs = pyfunc_outputs(model.signature.outputs)
    else:  # no output schema: the outputs are what the model answers on the sample
        with mlflow_scope(None, allow_code=True):
            mlflow = import_framework("mlflow.pyfunc", "mlflow")
            answer = mlflow.load_model(str(model.folder)).predict(
                model_py.pyfunc_input(io, rows))
        io["outputs"], outputs = outputs_of(answer)
    staged = tmp / "python"
    staged.mkdir()
    shutil.copyfile(model_py.__file__, staged / "model.py")
    (staged / model_py.IO_FILE).write_text(json.dumps(io, indent=2) + "\n")
    shutil.copytree(model.folder, staged / model_py.MODEL_FOLDER)
    try:
        return repo.add_python(name, staged, rows, trust_code=True, inputs=inputs,
                               outputs=outputs, feature_names=feature_names or names, **kwargs)
    except RedlineError as exc:  # name the MLflow model, not the folder it was staged in
        said = exc.message.replace(str(staged), f"{model.uri} (pyfunc)")
        raise type(exc)(said, **exc.details) from None


def pyfunc_inputs(model: MlflowModel, sample: Any
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], list[str] | None]:
    """How redline's tensors map to the pyfunc's input (``mlflow_io.json``'s ``input``), the
    tensor specs, and the feature names of a one-matrix input."""
    schema = model.signature.inputs if model.signature is not None else None
    example = model.input_example
    if schema is None:  # no signature: what the example (or the sample) is
        if hasattr(example, "dtypes"):
            return _column_inputs(model, [str(c) for c in example.columns],
                                  [_pandas_dtype(example[c]) for c in example.columns])
        if isinstance(example, dict):
            return _tensor_inputs({str(k): np.asarray(v) for k, v in example.items()})
        rows = example if example is not None else sample
        if rows is None or isinstance(rows, dict):
            raise InvalidInput(
                f"--from-mlflow {model.uri} was logged without a signature or an input example, "
                "so its inputs are unknown: pass --sample ROWS (.npz, .npy, .csv or .parquet "
                "with representative inputs), or log the model with input_example=")
        return _tensor_inputs({"input": np.asarray(rows)}, unnamed=True)
    if schema.is_tensor_spec():
        specs = {str(s.name or "input"): s for s in schema.inputs}
        io = {"kind": "tensor", "name": "input"} if not schema.has_input_names() else {
            "kind": "tensors", "names": list(specs)}
        tensors = [{"name": n, "datatype": _v2(s.type), "shape": [-1, *list(s.shape)[1:]]}
                   for n, s in specs.items()]
        return io, tensors, None
    columns, dtypes = [], []
    for i, col in enumerate(schema.inputs):
        kind = getattr(col.type, "name", str(col.type))
        if kind not in _COLUMN_DTYPES:
            raise ConversionError(
                f"--from-mlflow {model.uri}: its input column {col.name or i} is {kind}, which "
                "redline cannot pass as a tensor (numbers, booleans and strings it can)")
        columns.append(str(col.name) if col.name is not None else f"input_{i}")
        dtypes.append(_COLUMN_DTYPES[kind])
    return _column_inputs(model, columns, dtypes)


def _column_inputs(model: MlflowModel, columns: list[str], dtypes: list[str]
                   ) -> tuple[dict[str, Any], list[dict[str, Any]], list[str] | None]:
    """Numbers alone: one matrix ``input`` (float64 where a column needs it), named by the
    columns; with strings: one tensor per column."""
    if "object" not in dtypes:
        wide = any(d in ("float64", "int64") for d in dtypes)
        io = {"kind": "frame", "name": "input", "columns": columns, "dtypes": dtypes}
        spec = {"name": "input", "datatype": "FP64" if wide else "FP32",
                "shape": [-1, len(columns)]}
        return io, [spec], columns
    io = {"kind": "columns", "columns": columns, "dtypes": dtypes}
    return io, [{"name": c, "datatype": _v2(np.dtype(d)), "shape": [-1]}
                for c, d in zip(columns, dtypes, strict=True)], None


def _tensor_inputs(arrays: dict[str, np.ndarray], unnamed: bool = False
                   ) -> tuple[dict[str, Any], list[dict[str, Any]], list[str] | None]:
    io = ({"kind": "tensor", "name": next(iter(arrays))} if unnamed
          else {"kind": "tensors", "names": list(arrays)})
    return io, [{"name": n, "datatype": _v2(a.dtype), "shape": [-1, *a.shape[1:]]}
                for n, a in arrays.items()], None


def pyfunc_rows(model: MlflowModel, io: dict[str, Any], sample: Any) -> dict[str, np.ndarray]:
    """The sample (else the input example) as redline's tensors, named as the input spec ``io``
    says."""
    rows = model.input_example if sample is None else sample
    if rows is None:
        raise InvalidInput(
            f"--from-mlflow {model.uri} was logged without an input example, so there are no "
            "rows to check the Python model on: pass --sample ROWS (.npz, .npy, .csv or "
            ".parquet with representative inputs), or log the model with input_example=")
    kind = io["kind"]
    if kind in ("frame", "columns"):
        columns = io["columns"]
        if hasattr(rows, "columns"):
            missing = [c for c in columns if c not in rows.columns]
            if missing:
                raise InvalidInput(f"--from-mlflow {model.uri}: the {sample_word(sample)} "
                                   f"lacks the signature's columns {missing}")
            table = {c: rows[c].to_numpy() for c in columns}
        else:
            matrix = np.asarray(rows)
            if matrix.ndim != 2 or matrix.shape[1] != len(columns):
                raise InvalidInput(
                    f"--from-mlflow {model.uri}: the {sample_word(sample)} has shape "
                    f"{matrix.shape} but the MLflow signature takes {len(columns)} columns "
                    f"({', '.join(columns)})")
            table = {c: matrix[:, i] for i, c in enumerate(columns)}
        if kind == "frame":
            dtype = np.float64 if any(d in ("float64", "int64") for d in io["dtypes"]) else (
                np.float32)
            return {"input": np.column_stack([np.asarray(table[c], dtype=dtype)
                                              for c in columns])}
        return {c: np.asarray(table[c], dtype=object if d == "object" else d)
                for c, d in zip(columns, io["dtypes"], strict=True)}
    if kind == "tensors":
        if not isinstance(rows, dict):
            raise InvalidInput(f"--from-mlflow {model.uri} takes tensors "
                               f"{', '.join(io['names'])}: pass a sample with one array each")
        return {n: np.asarray(rows[n]) for n in io["names"]}
    return {io["name"]: np.asarray(next(iter(rows.values())) if isinstance(rows, dict)
                                   else rows)}


def pyfunc_outputs(schema: Any) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """``mlflow_io.json``'s outputs and their tensor specs, from MLflow's output schema."""
    io: list[dict[str, str]] = []
    specs: list[dict[str, Any]] = []
    several = len(schema.inputs) > 1
    for i, col in enumerate(schema.inputs):
        name = str(col.name) if col.name else (f"output_{i}" if several else "output")
        if schema.is_tensor_spec():
            dtype = np.dtype(col.type)
            shape = [-1, *list(col.shape)[1:]]
        else:
            kind = getattr(col.type, "name", str(col.type))
            if kind not in _COLUMN_DTYPES:
                raise ConversionError(f"the model's output {name} is {kind}, which redline "
                                      "cannot answer as a tensor")
            dtype, shape = np.dtype(_COLUMN_DTYPES[kind]), [-1]
        io.append({"name": name, "dtype": str(dtype)})
        specs.append({"name": name, "datatype": _v2(dtype), "shape": shape})
    return io, specs


def outputs_of(answer: Any) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """Output specs read off one answer of the model (it was logged without an output schema)."""
    if isinstance(answer, dict):
        arrays = {str(k): np.asarray(v) for k, v in answer.items()}
    elif hasattr(answer, "columns"):
        arrays = {str(c): answer[c].to_numpy() for c in answer.columns}
        if len(arrays) == 1:
            arrays = {"output": next(iter(arrays.values()))}
    else:
        arrays = {"output": np.asarray(answer.to_numpy() if hasattr(answer, "to_numpy")
                                       else answer)}
    io = [{"name": n, "dtype": "object" if a.dtype.kind in "OUS" else str(a.dtype)}
          for n, a in arrays.items()]
    specs = [{"name": n, "datatype": _v2(a.dtype), "shape": [-1, *a.shape[1:]]}
             for n, a in arrays.items()]
    return io, specs


def _v2(dtype: Any) -> str:
    from redline.models.datatypes import NUMPY_TO_V2

    dtype = np.dtype(dtype)
    return "BYTES" if dtype.kind in "OUS" else NUMPY_TO_V2.get(dtype, "BYTES")


def _pandas_dtype(series: Any) -> str:
    kind = series.dtype.kind
    return {"b": "bool", "i": "int64", "u": "int64", "f": "float64"}.get(kind, "object")
