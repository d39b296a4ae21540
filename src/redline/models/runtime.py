"""The ONNX Runtime engine: one ``InferenceSession`` per loaded model version.

``run`` is the hot path and does nothing but call ONNX Runtime; ``validate`` is the checked path
that every untrusted input goes through first (names, dtypes, shapes, NaN policy).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from redline.config import RuntimeSettings
from redline.errors import ConfigError, CorruptModel, ProviderUnavailable
from redline.models.metadata import ModelMetadata
from redline.models.repository import MODEL_FILE, ModelRepository
from redline.models.runner import ModelRunner

log = logging.getLogger("redline.models")

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_EXEC_MODES = {
    "sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
    "parallel": ort.ExecutionMode.ORT_PARALLEL,
}


def session_options(
    settings: RuntimeSettings, optimized_path: Path | None = None
) -> ort.SessionOptions:
    """ONNX Runtime options tuned for latency: few threads, no spinning across requests."""
    if settings.graph_optimization not in _OPT_LEVELS:
        raise ConfigError(
            f"runtime.graph_optimization must be one of {sorted(_OPT_LEVELS)}, "
            f"got {settings.graph_optimization!r}"
        )
    if settings.execution_mode not in _EXEC_MODES:
        raise ConfigError(
            f"runtime.execution_mode must be one of {sorted(_EXEC_MODES)}, "
            f"got {settings.execution_mode!r}"
        )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = settings.intra_op_threads
    opts.inter_op_num_threads = settings.inter_op_threads
    opts.graph_optimization_level = _OPT_LEVELS[settings.graph_optimization]
    opts.execution_mode = _EXEC_MODES[settings.execution_mode]
    opts.log_severity_level = 3
    if optimized_path is not None:
        opts.optimized_model_filepath = str(optimized_path)
    return opts


# Settings a model version may carry in ``metadata.extra["runtime"]`` (``redline optimize``
# records the winning ones there): they change how fast the version runs, never what it answers.
VERSION_RUNTIME_KEYS = ("graph_optimization", "intra_op_threads", "inter_op_threads",
                        "execution_mode", "providers")


def settings_for_version(settings: RuntimeSettings, metadata: ModelMetadata) -> RuntimeSettings:
    """The configured settings with the version's recorded runtime settings applied on top.

    A version optimized for a thread count or graph level must run with them wherever it is
    loaded, or its measured speed-up never reaches serving. Recorded providers apply only when
    this ONNX Runtime build has them all (a GPU-tuned version still loads on a CPU machine).
    """
    recorded = metadata.extra.get("runtime") if isinstance(metadata.extra, dict) else None
    if not isinstance(recorded, dict):
        return settings
    values = {k: v for k, v in recorded.items() if k in VERSION_RUNTIME_KEYS}
    providers = values.get("providers")
    if providers is not None and not set(providers) <= set(ort.get_available_providers()):
        values.pop("providers")
    if not values:
        return settings
    return dataclasses.replace(settings, **values)


CPU = "CPUExecutionProvider"
# The providers that need a GPU build of ONNX Runtime and the CUDA libraries (redline[gpu]).
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")
_warned: set[str] = set()  # fallback messages already logged by this process


def check_provider_names(requested: list[str]) -> None:
    """Refuse a name that no ONNX Runtime build has (a typo must not fall back in silence)."""
    unknown = [p for p in requested if p not in ort.get_all_providers()]
    if unknown:
        raise ConfigError(
            f"runtime.providers: {unknown} is not an ONNX Runtime execution provider; names "
            f"are spelled like CUDAExecutionProvider, TensorrtExecutionProvider, {CPU}"
        )


def serving_providers(requested: list[str]) -> list[str]:
    """The requested providers that this build has, in order, with the CPU last: a model asked
    onto a GPU still serves, on the CPU, where onnxruntime-gpu is missing."""
    check_provider_names(requested)
    available = ort.get_available_providers()
    chosen = [p for p in requested if p in available]
    if any(p in GPU_PROVIDERS for p in chosen):
        _preload_cuda_libraries()
    return chosen if CPU in chosen else [*chosen, CPU]


@functools.cache
def _preload_cuda_libraries() -> None:
    """Load CUDA and cuDNN once, from the nvidia-* wheels that redline[gpu] installs, else from
    the system's library path (onnxruntime-gpu 1.21+; it prints what it cannot find)."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()


def provider_fallback(requested: list[str], running: list[str]) -> str | None:
    """Why a session runs without some of the providers asked for, and what to do; ``None``
    when it has them all."""
    lost = [p for p in requested if p not in running and p != CPU]
    if not lost:
        return None
    available = ort.get_available_providers()
    absent = [p for p in lost if p not in available]
    failed = [p for p in lost if p in available]
    def names(found: list[str]) -> str:
        return ", ".join(found) + (" is" if len(found) == 1 else " are")

    why = []
    if absent:
        why.append(f"{names(absent)} not in this onnxruntime build (it has "
                   f"{', '.join(available)}): install redline[gpu], which replaces the CPU "
                   "onnxruntime wheel (docs/operations.md, GPU)")
    if failed:
        why.append(f"{names(failed)} in this build but did not start (ONNX Runtime's own "
                   "output says why: usually no GPU is visible, or the CUDA or cuDNN libraries "
                   "are missing or do not match the build)")
    return (f"runtime.providers asks for {', '.join(lost)}: {'; '.join(why)}. Serving on "
            f"{', '.join(running)} instead (set runtime.providers to [{CPU}] if that is meant)")


def choose_providers(requested: list[str]) -> list[str]:
    """The requested execution providers, refusing clearly any that this build lacks (for
    measurements, where a silent CPU fallback would give the wrong numbers)."""
    available = ort.get_available_providers()
    missing = [p for p in requested if p not in available]
    if missing:
        raise ProviderUnavailable(
            f"execution provider(s) {missing} requested in runtime.providers but not available "
            f"in this onnxruntime build (available: {available}); install redline[gpu] "
            "(onnxruntime-gpu) for CUDA/TensorRT, or set runtime.providers to "
            "[CPUExecutionProvider]"
        )
    return list(requested) or ["CPUExecutionProvider"]


class InferenceSession(ModelRunner):
    """A loaded, checked model version and its ONNX Runtime session."""

    platform = "onnxruntime_onnx"
    backend = "onnxruntime"

    def __init__(
        self,
        model_bytes: bytes,
        metadata: ModelMetadata,
        settings: RuntimeSettings | None = None,
        origin: str = "model",
    ) -> None:
        super().__init__(metadata, settings)
        optimized = None
        if self.settings.optimized_model_dir:
            folder = Path(self.settings.optimized_model_dir)
            folder.mkdir(parents=True, exist_ok=True)
            optimized = folder / f"{metadata.name}-{metadata.version}.optimized.onnx"
        providers = serving_providers(self.settings.providers)
        options = session_options(self.settings, optimized)
        try:
            self._session = ort.InferenceSession(
                model_bytes, sess_options=options, providers=providers
            )
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise CorruptModel(f"ONNX Runtime cannot load {origin}: {str(exc)[:300]}") from exc
        # Said once per process (every model shares runtime.providers), kept on each session
        # for the readiness answer.
        self.provider_fallback = provider_fallback(self.settings.providers, self.providers)
        if self.provider_fallback and self.provider_fallback not in _warned:
            _warned.add(self.provider_fallback)
            log.warning("%s", self.provider_fallback)
        self._run = self._session.run
        # One RunOptions for every run: given none, ONNX Runtime builds a default one per call
        # (measured, one row of the demo forest: 4.72 -> 4.22 µs a run).
        self._run_options = ort.RunOptions()

    @classmethod
    def load(
        cls,
        repo: ModelRepository,
        name: str,
        version: int | str | None = None,
        settings: RuntimeSettings | None = None,
    ) -> InferenceSession:
        """Load a version, checking its bytes against the recorded sha256 first; the version's
        recorded runtime settings (``metadata.extra["runtime"]``) apply over ``settings``."""
        meta = repo.metadata(name, version)
        path = repo.version_dir(name, meta.version) / MODEL_FILE
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CorruptModel(f"cannot read model file {path}: {exc.strerror}") from exc
        actual = hashlib.sha256(data).hexdigest()
        if actual != meta.sha256:
            raise CorruptModel(
                f"model file {path} does not match its recorded sha256 (expected "
                f"{meta.sha256[:12]}…, found {actual[:12]}…): it was modified or damaged after "
                "it was added; add the model again"
            )
        tuned = settings_for_version(settings or RuntimeSettings(), meta)
        return cls(data, meta, tuned, origin=str(path))

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], settings: RuntimeSettings | None = None
    ) -> InferenceSession:
        """Load a bare ONNX file outside any repository (tools, benchmarks)."""
        from redline.models.onnxfile import inspect_onnx

        data = Path(path).read_bytes()
        inputs, outputs = inspect_onnx(data, str(path))
        meta = ModelMetadata(
            name=Path(path).stem,
            version=1,
            inputs=inputs,
            outputs=outputs,
            sha256=hashlib.sha256(data).hexdigest(),
        )
        return cls(data, meta, settings, origin=str(path))

    # ------------------------------------------------------------------ hot path
    def run(
        self, inputs: Mapping[str, np.ndarray], output_names: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run already-validated inputs. Releases the GIL inside ONNX Runtime."""
        names = output_names or self.output_names
        return dict(zip(names, self._run(names, inputs, self._run_options), strict=True))

    @property
    def session_options(self) -> ort.SessionOptions:
        """The options ONNX Runtime built this session with (threads, graph level)."""
        return self._session.get_session_options()

    @property
    def providers(self) -> list[str]:
        return list(self._session.get_providers())
