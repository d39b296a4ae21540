"""The model repository on disk: ``<repository>/<model>/<version>/{model.onnx,metadata.json}``.

Legible without docs, like Triton's: list a folder and you see the models and their versions.
Per model, ``aliases.json`` maps names such as ``production`` to a version (with the history that
``rollback`` walks back) and ``policy.json`` holds the version policy. Every write is atomic: a
version is assembled in a hidden temporary folder and renamed into place in one step, so a crash
or a full disk never leaves a half-written version visible.

One job a module: ``model_repository`` finds, resolves and reads versions; ``onnx_versions``
and ``graph_versions`` add them (Python models: ``models/python/add.py``); ``promotion`` says
what serves (aliases, policy); ``integrity`` checks a version's files; ``durable`` writes;
``layout`` names the files.
"""

from redline.models.onnxfile import inspect_onnx
from redline.models.repository.layout import (
    ALIASES_FILE,
    GRAPH_FILE,
    METADATA_FILE,
    MODEL_FILE,
    POLICY_FILE,
    PYTHON_FILE,
    check_name,
    sha256_file,
)
from redline.models.repository.model_repository import ModelRepository
from redline.models.repository.onnx_versions import RegistrationWarning

__all__ = [
    "ALIASES_FILE",
    "GRAPH_FILE",
    "METADATA_FILE",
    "MODEL_FILE",
    "POLICY_FILE",
    "PYTHON_FILE",
    "ModelRepository",
    "RegistrationWarning",
    "check_name",
    "inspect_onnx",
    "sha256_file",
]
