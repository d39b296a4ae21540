"""PyTorch to ONNX: an ``nn.Module`` through the TorchScript exporter, batch axis dynamic."""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np

from redline.models.convert.frameworks import conversion_failed, import_framework
from redline.models.convert.signature import INPUT_NAME, TORCH_OUTPUTS, ConvertedModel, plain


def convert_torch(module: Any, x: np.ndarray, opset: int) -> ConvertedModel:
    """A PyTorch ``nn.Module`` via the TorchScript exporter, batch axis dynamic.

    A module is a regressor unless it declares ``classes_`` (its class labels, in output order).
    """
    torch = import_framework("torch", "torch")
    module.eval()
    dynamic = {INPUT_NAME: {0: "batch"}, TORCH_OUTPUTS[0]: {0: "batch"}}
    buf = io.BytesIO()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter, chosen below
            torch.onnx.export(
                module,
                (torch.from_numpy(x),),
                buf,
                input_names=[INPUT_NAME],
                output_names=TORCH_OUTPUTS,
                dynamic_axes=dynamic,
                opset_version=opset,
                dynamo=False,  # the legacy exporter works offline and needs no onnxscript
            )
    except Exception as exc:
        raise conversion_failed(module, exc) from exc
    labels = getattr(module, "classes_", None)  # opt-in: a module may declare its class labels
    return ConvertedModel(
        onnx_bytes=buf.getvalue(),
        framework="pytorch",
        framework_version=str(torch.__version__),
        task="classification" if labels is not None else "regression",
        class_labels=[plain(c) for c in labels] if labels is not None else None,
        input_name=INPUT_NAME,
        output_names=list(TORCH_OUTPUTS),
        n_features=int(np.prod(x.shape[1:])),
        max_abs_diff=0.0,
        handles_missing=False,
    )
