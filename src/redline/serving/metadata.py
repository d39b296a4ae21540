"""What the server says about itself and its models, on both transports (V2 metadata, Triton's
model configuration extension)."""

from __future__ import annotations

from typing import Any

from redline.serving.handle import ModelHandle
from redline.serving.registry import ModelRegistry

EXTENSIONS = ["binary_tensor_data", "model_configuration", "x-redline-budget"]


def model_metadata(registry: ModelRegistry, params: dict[str, str]) -> dict[str, Any]:
    """The V2 model metadata object (shared with the gRPC service)."""
    handle = registry.get(params["name"], params.get("version"))
    return {
        "name": handle.name,
        # The versions a request can be served by: loaded and warm (not broken, not unloaded,
        # not outside the version policy; the admin index lists those with their state).
        "versions": [str(h.version) for h in registry.loaded(handle.name)],
        "platform": handle.session.platform,
        "inputs": [t.to_dict() for t in handle.session.inputs],
        "outputs": [t.to_dict() for t in handle.session.outputs],
    }


def triton_config(handle: ModelHandle) -> dict[str, Any]:
    """Triton's model configuration extension: what perf_analyzer reads before it starts."""
    batched = handle.batcher.batchable

    def tensors(specs: list[Any]) -> list[dict[str, Any]]:
        return [{"name": t.name, "data_type": "TYPE_" + ("STRING" if t.datatype == "BYTES" else
                                                          t.datatype),
                 "dims": t.shape[1:] if batched else t.shape} for t in specs]

    return {
        "name": handle.name,
        "platform": handle.session.platform,
        "backend": handle.session.backend,
        "max_batch_size": handle.batcher.max_batch if batched else 0,
        "input": tensors(handle.session.inputs),
        "output": tensors(handle.session.outputs),
        "dynamic_batching": {
            "max_queue_delay_microseconds": handle.batcher.settings.max_queue_delay_us
        },
    }


