"""The Python floor: one bare ASGI callable, orjson and ONNX Runtime, nothing else.

Run by ``compare.py`` in the floors' own virtual environment (``benchmarks/peers/``):
``MODEL=model.onnx python -m uvicorn bare_asgi:app --http httptools --loop uvloop``.
It answers ``POST /v2/models/<any>/infer`` with a V2 JSON body (one FP32 input, flat ``data``)
and ``GET /v2/health/ready``; it validates nothing, which is what makes it a floor.
"""

import os

import numpy as np
import onnxruntime as ort
import orjson

_options = ort.SessionOptions()
_options.intra_op_num_threads = 1
_session = ort.InferenceSession(os.environ["MODEL"], _options, providers=["CPUExecutionProvider"])
_input = _session.get_inputs()[0]
_width = int(_input.shape[1])
_outputs = [o.name for o in _session.get_outputs()]


def _head(body: bytes) -> dict[str, object]:
    return {"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}


async def app(scope, receive, send):  # noqa: ANN001, ANN201 - the bare ASGI signature
    if scope["type"] != "http":
        return
    if scope["method"] == "GET":
        await send(_head(b"{}"))
        await send({"type": "http.response.body", "body": b"{}"})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    request = orjson.loads(body)
    data = np.asarray(request["inputs"][0]["data"], dtype=np.float32).reshape(-1, _width)
    results = _session.run(_outputs, {_input.name: data})
    answer = {"model_name": "rf", "outputs": [
        {"name": name, "datatype": "FP32" if r.dtype == np.float32 else "INT64",
         "shape": list(r.shape), "data": r.ravel().tolist()}
        for name, r in zip(_outputs, results, strict=True)]}
    body = orjson.dumps(answer)
    await send(_head(body))
    await send({"type": "http.response.body", "body": body})
