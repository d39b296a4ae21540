"""An ONNX model as given: nothing to convert, only checked to load and run on the sample."""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.errors import ConversionError
from redline.models.convert.parity import ort_session
from redline.models.convert.signature import ConvertedModel


def load_onnx(model: Any, x: np.ndarray) -> ConvertedModel:
    """An ONNX model given as bytes or ``ModelProto``: checked to load and run on the sample."""
    import onnx

    data = bytes(model) if isinstance(model, (bytes, bytearray)) else model.SerializeToString()
    session = ort_session(data)
    inputs = session.get_inputs()
    outputs = [o.name for o in session.get_outputs()]
    try:
        session.run(None, {inputs[0].name: x})
    except Exception as exc:
        raise ConversionError(
            f"the ONNX model does not run on the sample: {str(exc).rstrip('. ')}. "
            "Check the sample's shape "
            "and dtype against the model's input."
        ) from exc
    is_classifier = "probabilities" in outputs
    return ConvertedModel(
        onnx_bytes=data,
        framework="onnx",
        framework_version=str(onnx.__version__),
        task="classification" if is_classifier else "regression",
        class_labels=None,
        input_name=inputs[0].name,
        output_names=outputs,
        n_features=int(np.prod(x.shape[1:])),
        max_abs_diff=0.0,
        handles_missing=False,
    )
