"""How teams build a model service today: FastAPI on uvicorn with ONNX Runtime.

Run by ``compare.py`` in the floors' own virtual environment (``benchmarks/peers/``):
``MODEL=model.onnx python -m uvicorn fastapi_onnx:app --http httptools --loop uvloop``.
The request and answer are pydantic models of the V2 JSON body, as a FastAPI service writes them.
"""

import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from pydantic import BaseModel

_options = ort.SessionOptions()
_options.intra_op_num_threads = 1
_session = ort.InferenceSession(os.environ["MODEL"], _options, providers=["CPUExecutionProvider"])
_input = _session.get_inputs()[0]
_width = int(_input.shape[1])
_outputs = [o.name for o in _session.get_outputs()]

app = FastAPI()


class Tensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[float]


class InferRequest(BaseModel):
    inputs: list[Tensor]


class InferResponse(BaseModel):
    model_name: str
    outputs: list[Tensor]


@app.get("/v2/health/ready")
def ready() -> dict[str, bool]:
    return {"ready": True}


@app.post("/v2/models/{model}/infer")
def infer(model: str, request: InferRequest) -> InferResponse:
    data = np.asarray(request.inputs[0].data, dtype=np.float32).reshape(-1, _width)
    results = _session.run(_outputs, {_input.name: data})
    return InferResponse(model_name=model, outputs=[
        Tensor(name=name, datatype="FP32", shape=list(r.shape), data=r.ravel().tolist())
        for name, r in zip(_outputs, results, strict=True)])
