"""The gRPC floor: a bare grpc.aio server of the KServe V2 ``ModelInfer`` call and ONNX Runtime.

Run by ``compare.py`` in the floors' own virtual environment (``benchmarks/peers/``):
``MODEL=model.onnx PORT=8098 python bare_grpc.py``. Messages are tritonclient's generated
classes for the standard ``inference.GRPCInferenceService``; tensors travel as raw contents.
"""

import asyncio
import os

import grpc
import numpy as np
import onnxruntime as ort
from tritonclient.grpc import service_pb2 as pb

_options = ort.SessionOptions()
_options.intra_op_num_threads = 1
_session = ort.InferenceSession(os.environ["MODEL"], _options, providers=["CPUExecutionProvider"])
_input = _session.get_inputs()[0]
_width = int(_input.shape[1])
_outputs = [o.name for o in _session.get_outputs()]


async def model_infer(request: pb.ModelInferRequest, context: object) -> pb.ModelInferResponse:
    data = np.frombuffer(request.raw_input_contents[0], dtype=np.float32).reshape(-1, _width)
    results = _session.run(_outputs, {_input.name: data})
    reply = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    for name, r in zip(_outputs, results, strict=True):
        reply.outputs.add(name=name, datatype="FP32" if r.dtype == np.float32 else "INT64",
                          shape=list(r.shape))
        reply.raw_output_contents.append(r.tobytes())
    return reply


async def main() -> None:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            model_infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{os.environ.get('PORT', '8098')}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
