"""MLServer's side of the Python-model comparison: rowsum as a custom runtime.

    python mlserver_rowsum.py FOLDER HTTP_PORT GRPC_PORT WORKERS
    mlserver start FOLDER

Writes, with the ``mlserver`` peer's interpreter (``benchmarks/peers/setup.sh mlserver``), an
MLServer folder serving ``rowsum`` (``OUTPUT0`` = row sums of a ``[n, 16]`` FP32 ``INPUT0``) from
the custom runtime below, as MLServer's documentation writes one: an ``MLModel`` whose
``predict`` decodes the V2 input with ``NumpyCodec`` and encodes its output the same way. Its
``settings.json``: ``parallel_workers`` WORKERS (0: inference in the main process; 1: MLServer's
default, one inference worker process), metrics off, access log off (``debug: false``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class RowSum(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output("OUTPUT0", x.sum(axis=1, dtype="float32"))])


def write(folder: Path, http_port: int, grpc_port: int, workers: int) -> None:
    model = folder / "rowsum"
    model.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__), model / "rowsum_runtime.py")  # the model folder is on the path
    (folder / "settings.json").write_text(json.dumps({
        "debug": False, "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port,
        "metrics_endpoint": None, "parallel_workers": workers}, indent=2))
    (model / "model-settings.json").write_text(json.dumps({
        "name": "rowsum", "implementation": "rowsum_runtime.RowSum",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}]}, indent=2))


if __name__ == "__main__":
    write(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
