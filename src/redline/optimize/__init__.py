"""Model optimization and the latency gate: quantization, pruning, distillation, profiling.

Public face for the CLI and for Python users. Works on registered ONNX models, whatever
framework they came from; PyTorch helpers import torch lazily (extra ``redline[torch]``).
Must not import ``redline.serving``.
"""

from redline.optimize.candidates import Candidate, Skipped, TuneContext
from redline.optimize.gate import GateOptions, GateResult, run_gate
from redline.optimize.optimizer import (
    TECHNIQUES,
    CandidateResult,
    OptimizeOptions,
    OptimizeReport,
    optimize,
)
from redline.optimize.profile import ModelRunner, measure_latency, task_metrics
from redline.optimize.prune import prune_sklearn_mlp, prune_torch_sequential
from redline.optimize.register import register_candidate

__all__ = [
    "TECHNIQUES",
    "Candidate",
    "CandidateResult",
    "GateOptions",
    "GateResult",
    "ModelRunner",
    "OptimizeOptions",
    "OptimizeReport",
    "Skipped",
    "TuneContext",
    "measure_latency",
    "optimize",
    "prune_sklearn_mlp",
    "prune_torch_sequential",
    "register_candidate",
    "run_gate",
    "task_metrics",
]
