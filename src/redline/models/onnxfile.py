"""An ONNX file's signature: parse, check and name its tensors, before anything serves it.

A leaf of ``models/``: the repository, the runtime and the graph checker all read a file's
signature through it, so none of them imports another to do so.
"""

from __future__ import annotations

from typing import Any

from redline.errors import CorruptModel, InvalidInput
from redline.models.metadata import TensorSpec


def inspect_onnx(data: bytes, origin: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Parse and check an ONNX model; return its input and output signature."""
    import onnx

    from redline.models.datatypes import ONNX_TO_V2

    try:
        model = onnx.load_from_string(data)
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx raises several unrelated types for bad bytes
        raise CorruptModel(
            f"{origin} is not a valid ONNX model ({type(exc).__name__}: {str(exc)[:200]}); "
            "export it to ONNX first, or use `redline models add --from-pickle` to convert"
        ) from exc
    initializers = {i.name for i in model.graph.initializer}

    def spec(value: Any) -> TensorSpec:
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise InvalidInput(
                f"{origin}: '{value.name}' is not a tensor (a ZipMap or sequence output?); "
                "convert classifiers with zipmap disabled"
            )
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        return TensorSpec(value.name, ONNX_TO_V2.get(tensor.elem_type, "BYTES"), dims)

    inputs = [spec(v) for v in model.graph.input if v.name not in initializers]
    outputs = [spec(v) for v in model.graph.output]
    return inputs, outputs
