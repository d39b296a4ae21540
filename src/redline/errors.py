"""The exception hierarchy every user-facing error belongs to.

Each error carries a stable machine-readable ``code``, an HTTP status and a gRPC status name, so
the REST app, the gRPC service and the CLI map it the same way. A user error never becomes a 500.
"""

from __future__ import annotations

from typing import Any, ClassVar


class RedlineError(Exception):
    """Base of every error redline raises on purpose. ``str(err)`` is the message for users."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500
    grpc_status: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_v2(self) -> dict[str, Any]:
        """The Open Inference Protocol v2 error body (``{"error": ...}``) plus the stable code."""
        return {"error": self.message, "code": self.code}


class ConfigError(RedlineError):
    """``redline.yaml`` is wrong: unknown key, wrong type, unreadable file."""

    code = "config_invalid"
    http_status = 400
    grpc_status = "INVALID_ARGUMENT"


class InvalidInput(RedlineError):
    """A request does not match what the model or feature view expects."""

    code = "invalid_input"
    http_status = 400
    grpc_status = "INVALID_ARGUMENT"


class InvalidBudget(InvalidInput):
    """A request's latency budget is not a usable number of milliseconds (code: invalid_input,
    the same on every API and transport; the message names where the budget came from)."""


class PayloadTooLarge(InvalidInput):
    code = "payload_too_large"
    http_status = 413
    grpc_status = "RESOURCE_EXHAUSTED"


class NotFound(RedlineError):
    """A named thing (model, version, alias, feature view, entity) does not exist."""

    code = "not_found"
    http_status = 404
    grpc_status = "NOT_FOUND"


class ModelNotFound(NotFound):
    code = "model_not_found"


class VersionNotFound(NotFound):
    code = "version_not_found"


class FeatureNotFound(NotFound):
    code = "feature_not_found"


class ModelNotReady(RedlineError):
    """The model exists but no version is loaded and warm (yet)."""

    code = "model_not_ready"
    http_status = 503
    grpc_status = "UNAVAILABLE"


class CorruptModel(RedlineError):
    """A model file is not valid ONNX or its sha256 differs from the one recorded at ``add``."""

    code = "model_corrupt"
    http_status = 500
    grpc_status = "DATA_LOSS"


class ConversionError(RedlineError):
    """A framework model could not be converted to ONNX, or the converted model disagrees."""

    code = "conversion_failed"
    http_status = 400
    grpc_status = "INVALID_ARGUMENT"


class RepositoryError(RedlineError):
    """A repository operation is not allowed (duplicate version, removing a promoted version...)."""

    code = "repository_conflict"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class PerWorkerState(RedlineError):
    """A request for state that each worker process keeps alone (a label join kept in memory,
    an admin load/unload) reached a server of several workers behind one port."""

    code = "per_worker_state"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class ProviderUnavailable(RedlineError):
    """An execution provider (CUDA, TensorRT) was asked for but is not present."""

    code = "provider_unavailable"
    http_status = 500
    grpc_status = "FAILED_PRECONDITION"


class ModelFailed(RedlineError):
    """The model itself raised while running a request's inputs (a bug or a bad model file, not
    the client's input): the client gets a 500 naming the model, the log one ERROR line."""

    code = "model_failed"
    http_status = 500
    grpc_status = "INTERNAL"


class ModelError(ModelFailed):
    """A Python model (``model.py``) failed: its code cannot be imported or loaded, its
    ``predict`` raised, or it answered outside its declared signature (dtype, shape, NaN).
    The client gets a 500 with the model's message; the log gets the traceback once."""

    code = "model_error"


class Overloaded(RedlineError):
    """Admission refused the request: the queue is full or the budget cannot be met."""

    code = "overloaded"
    http_status = 429
    grpc_status = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after_s: float = 0.05, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(RedlineError):
    """The request's budget ran out before it could be served."""

    code = "deadline_exceeded"
    http_status = 504
    grpc_status = "DEADLINE_EXCEEDED"


class Unauthorized(RedlineError):
    code = "unauthorized"
    http_status = 401
    grpc_status = "UNAUTHENTICATED"


class StoreUnavailable(RedlineError):
    """The online store (Redis) cannot be reached; callers degrade instead of failing."""

    code = "store_unavailable"
    http_status = 503
    grpc_status = "UNAVAILABLE"


class VersionMismatch(RedlineError):
    """A model was trained on feature-view versions other than the ones being served."""

    code = "feature_version_mismatch"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class MissingDependency(RedlineError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    code = "missing_dependency"
    http_status = 500
    grpc_status = "FAILED_PRECONDITION"


class Unreachable(RedlineError):
    """A server or service the command talks to does not answer (nothing listens, wrong URL)."""

    code = "unreachable"
    http_status = 503
    grpc_status = "UNAVAILABLE"


def describe(exc: BaseException) -> str:
    """An exception as one log line's reason: ``Type: message`` (``Type`` alone when empty)."""
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")
