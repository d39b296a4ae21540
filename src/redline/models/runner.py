"""What the server runs a model version through: the part every engine shares.

``InferenceSession`` (ONNX Runtime) and ``PythonSession`` (a ``model.py``) are both a
``ModelRunner``: the handle, the batcher, warm-up and the edges see one interface, so a Python
model is batched, budgeted, swapped and measured exactly like an ONNX one; only ``run`` differs.
``validate`` is the checked path every untrusted input goes through first (names, dtypes, shapes,
NaN policy), identical for every engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from redline.config import RuntimeSettings
from redline.errors import InvalidInput
from redline.models.datatypes import FLOAT_TYPES, INT_TYPES, V2_TO_NUMPY
from redline.models.metadata import ModelMetadata, TensorSpec

# Largest integer magnitude a float type holds exactly: beyond it an int -> float cast loses data.
_EXACT_INT = {"FP16": 2**11, "FP32": 2**24, "FP64": 2**53}


class ModelRunner:
    """A loaded model version: its signature, the checked path, and ``run`` (the hot path)."""

    # True when ``run`` executes a user's own Python: it may hang, so it runs on the event loop
    # only under a guard that stops it, and a run its requests' budgets gave up on is abandoned.
    user_code: bool = False
    # Whether a short run may happen on the event loop's thread at all (not when every run is a
    # round trip to another process).
    inline_ok: bool = True
    # Threads the server gives this version's runs (one batch runs at a time; more only take
    # over from runs abandoned past their budget).
    worker_threads: int = 1
    # Batches of this version that may run at once (worker processes each run one).
    concurrent_runs: int = 1
    # Why the version runs without a provider that was asked for (ONNX Runtime), else None.
    provider_fallback: str | None = None
    # What V2 metadata and Triton's model configuration call the engine.
    platform: str = ""
    backend: str = ""

    def __init__(self, metadata: ModelMetadata, settings: RuntimeSettings | None = None) -> None:
        self.settings = settings or RuntimeSettings()
        self.metadata = metadata
        self.inputs: list[TensorSpec] = metadata.inputs
        self.outputs: list[TensorSpec] = metadata.outputs
        self.output_names = [o.name for o in self.outputs]
        self.allow_missing = metadata.missing_values == "allow"
        self._dtypes = {t.name: V2_TO_NUMPY[t.datatype] for t in self.inputs}

    # ------------------------------------------------------------------ hot path
    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run already-validated inputs (first dimension: rows); every output, by name."""
        raise NotImplementedError

    # ------------------------------------------------------------------ checked path
    def validate(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Check names, dtypes (safe casts), shapes and the NaN policy; return arrays to run."""
        expected = {t.name for t in self.inputs}
        unknown = sorted(set(inputs) - expected)
        if unknown:
            raise InvalidInput(
                f"unknown input(s) {unknown} for model '{self.metadata.name}'; "
                f"expected {sorted(expected)}"
            )
        result: dict[str, np.ndarray] = {}
        batch: int | None = None
        for spec in self.inputs:
            if spec.name not in inputs:
                raise InvalidInput(
                    f"missing input '{spec.name}' for model '{self.metadata.name}' "
                    f"(expected {spec.datatype} with shape {spec.shape})"
                )
            array = self._coerce(spec, inputs[spec.name])
            self._check_shape(spec, array)
            if array.ndim and spec.shape and spec.shape[0] == -1:
                if batch is not None and array.shape[0] != batch:
                    raise InvalidInput(
                        f"input '{spec.name}' has {array.shape[0]} rows but other inputs have "
                        f"{batch}; every input needs the same batch size"
                    )
                batch = array.shape[0]
            result[spec.name] = array
        return result

    def _coerce(self, spec: TensorSpec, value: Any) -> np.ndarray:
        target = self._dtypes[spec.name]
        if spec.datatype == "BYTES":
            array = np.asarray(value, dtype=object)
            return array
        try:
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(
                f"input '{spec.name}' is not a rectangular array of numbers ({exc}); "
                f"expected {spec.datatype} with shape {spec.shape}"
            ) from exc
        if array.dtype == target:
            return self._check_finite(spec, array)
        kind = array.dtype.kind
        if kind in "USO":
            raise InvalidInput(
                f"input '{spec.name}' holds strings/objects but the model expects "
                f"{spec.datatype}; send numbers"
            )
        if kind == "b" and spec.datatype != "BOOL":
            raise InvalidInput(
                f"input '{spec.name}' holds booleans; the model expects {spec.datatype}"
            )
        if spec.datatype in FLOAT_TYPES:
            if kind in "iu":
                limit = _EXACT_INT[spec.datatype]
                if array.size and np.abs(array).max() > limit:
                    raise InvalidInput(
                        f"input '{spec.name}' has integers above {limit}, which "
                        f"{spec.datatype} cannot hold exactly; send floats or scale them"
                    )
            elif kind == "f" and array.dtype.itemsize > target.itemsize:
                finite = array[np.isfinite(array)]
                if finite.size and np.abs(finite).max() > np.finfo(target).max:
                    raise InvalidInput(
                        f"input '{spec.name}' has values beyond the range of {spec.datatype}"
                    )
            return self._check_finite(spec, array.astype(target))
        if spec.datatype in INT_TYPES and kind in "iu":
            info = np.iinfo(target)
            if array.size and (array.min() < info.min or array.max() > info.max):
                raise InvalidInput(
                    f"input '{spec.name}' has values outside the range of {spec.datatype} "
                    f"[{info.min}, {info.max}]"
                )
            return array.astype(target)
        if np.can_cast(array.dtype, target, casting="safe"):
            return array.astype(target)
        raise InvalidInput(
            f"input '{spec.name}' has dtype {array.dtype} which cannot be safely cast to "
            f"{spec.datatype}; send {spec.datatype} data"
        )

    def _check_finite(self, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
        if self.allow_missing or array.dtype.kind != "f":
            return array
        bad = ~np.isfinite(array)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidInput(
                f"input '{spec.name}' contains NaN or infinity (first at index {list(where)}); "
                f"model '{self.metadata.name}' does not handle missing values — impute them, or "
                "register a model that does (missing_values='allow')"
            )
        return array

    def _check_shape(self, spec: TensorSpec, array: np.ndarray) -> None:
        if array.ndim != len(spec.shape):
            raise InvalidInput(
                f"input '{spec.name}' has shape {list(array.shape)} but the model expects "
                f"{spec.shape} (-1 = any size)"
            )
        for axis, (got, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
            if want != -1 and got != want:
                raise InvalidInput(
                    f"input '{spec.name}' has {got} along axis {axis} but the model expects "
                    f"{want} (shape {spec.shape}, -1 = any size)"
                )

    # ------------------------------------------------------------------ lifecycle
    def example_inputs(self, batch_size: int) -> dict[str, np.ndarray]:
        """Zero-valued inputs of a given batch size (for warm-up and profiling)."""
        example = {}
        for spec in self.inputs:
            shape = [
                batch_size if i == 0 and d == -1 else (d if d > 0 else 1)
                for i, d in enumerate(spec.shape)
            ]
            dtype = self._dtypes[spec.name]
            if spec.datatype == "BYTES":
                example[spec.name] = np.full(shape, "", dtype=object)
            else:
                example[spec.name] = np.zeros(shape, dtype=dtype)
        return example

    def warmup(self, batch_sizes: list[int] | None = None, runs: int | None = None) -> None:
        """Run each batch size a few times so the first real request pays no allocation cost."""
        sizes = batch_sizes or self.settings.warmup_batch_sizes
        dynamic = bool(self.inputs) and all(s.shape and s.shape[0] == -1 for s in self.inputs)
        for size in sizes if dynamic else [1]:
            example = self.example_inputs(size)
            for _ in range(runs or self.settings.warmup_runs):
                self.run(example)

    @property
    def providers(self) -> list[str]:
        """Where runs happen (ONNX Runtime's execution providers)."""
        return []

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.metadata.name,
            "version": self.metadata.version,
            "providers": self.providers,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }

    def abandon(self, thread_id: int) -> None:
        """The run on worker thread ``thread_id`` outlived every request waiting for it: stop it
        where the engine can (a worker process is replaced); a thread cannot be stopped."""

    def close(self) -> None:
        """Release what the version holds beyond memory (worker processes, shared memory)."""
