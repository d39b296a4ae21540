"""The per-worker load meter counts gRPC calls (V2 and /v1) like REST requests."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from redline.config import Settings
from redline.models import ModelRepository
from redline.proto import grpc_service_pb2 as pb
from redline.proto import grpc_service_pb2_grpc as pbg
from redline.proto import redline_v1_pb2 as v1pb
from redline.proto import redline_v1_pb2_grpc as v1g
from redline.scaling.loadmeter import AsgiMeter, GrpcMeter, LoadBoard, LoadMeter
from tests.serving.helpers import ServerThread, affine_model, slow_model

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def test_grpc_v2_and_v1_and_rest_are_metered(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path / "repo")
    repo.add_onnx("affine", affine_model())
    repo.add_onnx("slow", slow_model(layers=200))
    board = LoadBoard.create()
    meter = LoadMeter(board, slot=3)
    settings = Settings()
    settings.server.watch_repository = False
    served = ServerThread(settings, repo)
    served.server.asgi = AsgiMeter(served.server.app, meter)
    served.server.grpc_interceptors.append(GrpcMeter(meter))
    served.start()
    channel = grpc.insecure_channel(served.grpc)
    try:
        v2 = pbg.GRPCInferenceServiceStub(channel)
        stub = v2.ModelInfer
        slow = pb.ModelInferRequest(model_name="slow")
        slow.inputs.add(name="x", datatype="FP32", shape=[1, 384])
        slow.raw_input_contents.append(np.ones(384, np.float32).tobytes())
        # Calls in flight are seen as in flight while they run...
        seen = [0]
        calls = [threading.Thread(target=lambda: stub(slow, timeout=30)) for _ in range(3)]
        for t in calls:
            t.start()
        while any(t.is_alive() for t in calls):
            seen[0] = max(seen[0], board.read(3)[0])
            time.sleep(0.001)
        assert seen[0] >= 1
        in_flight, finished, p99_us, _ = board.read(3)
        assert (in_flight, finished) == (0, 3) and p99_us >= 0
        # ...and every kind of call counts once: V2 over gRPC, /v1 over gRPC (an error too),
        # REST.
        affine = pb.ModelInferRequest(model_name="affine")
        affine.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        affine.raw_input_contents.append(np.ones(4, np.float32).tobytes())
        v2.ModelInfer(affine, timeout=10)
        predict = v1pb.PredictRequest(model_name="affine")  # type: ignore[attr-defined]
        predict.instances.add()
        try:
            v1g.PredictionServiceStub(channel).Predict(predict, timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() != grpc.StatusCode.UNIMPLEMENTED
        assert httpx.get(f"{served.http}/v2/health/ready").status_code == 200
        time.sleep(0.3)  # the p99 is refreshed at most every 0.25 s
        meter.begin()  # publishes
        in_flight, finished, p99_us, _ = board.read(3)
        assert (in_flight, finished) == (1, 6)
        assert p99_us > 0
    finally:
        channel.close()
        served.stop()
