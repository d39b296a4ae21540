"""Serving: Open Inference Protocol v2 over REST and gRPC, dynamic batching, budgets, hot swaps.

Public face: the server, the app and registry other packages extend, and the model handle API
(``await registry.get(name).infer(inputs, deadline)``, see ``serving/handle.py``).
"""

from redline.serving.app import HttpRequest, HttpResponse, RestApp
from redline.serving.deadline import HIGH, LOW, deadline_from_ms
from redline.serving.handle import ModelHandle
from redline.serving.registry import ModelRegistry
from redline.serving.server import RedlineServer

__all__ = [
    "HIGH", "LOW", "HttpRequest", "HttpResponse", "ModelHandle", "ModelRegistry",
    "RedlineServer", "RestApp", "deadline_from_ms",
]
