"""Model repository, converters to ONNX, the ONNX Runtime engine and Python models.

Public face: what serving, optimize and the CLI may import. ``convert`` is imported lazily by
``ModelRepository.add_estimator`` because the converters pull in scikit-learn and friends.
"""

from redline.models.loading import load_runner
from redline.models.metadata import ModelMetadata, TensorSpec, profile_inputs
from redline.models.onnxfile import inspect_onnx
from redline.models.policy import VersionPolicy
from redline.models.python import PythonSession
from redline.models.repository import ModelRepository, sha256_file
from redline.models.runner import ModelRunner
from redline.models.runtime import InferenceSession, choose_providers, session_options

__all__ = [
    "InferenceSession",
    "ModelMetadata",
    "ModelRepository",
    "ModelRunner",
    "PythonSession",
    "TensorSpec",
    "VersionPolicy",
    "choose_providers",
    "inspect_onnx",
    "load_runner",
    "profile_inputs",
    "session_options",
    "sha256_file",
]
