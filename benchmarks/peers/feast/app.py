"""The Feast peer: FastAPI + Feast's Redis online store + ONNX Runtime, as teams build it today.

``POST /predict {"card": k}`` reads the card's 40 features (5 views of 8) from Feast and runs the
100-tree model on them; ``GET /health`` says which mode runs. Runs in the Feast peer's own
environment (``benchmarks/peers/setup.sh feast``), under uvicorn:

    FEAST_REPO=REPO MODEL_PATH=MODEL python -m uvicorn app:app --loop uvloop --http httptools \\
        --no-access-log --port 8197

``FEAST_MODE=async`` (default): an ``async def`` endpoint and ``get_online_features_async``,
the path Feast's own feature server takes for Redis; ``sync``: a plain ``def`` endpoint (FastAPI's
thread pool) and ``get_online_features``.
"""

import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from feast import FeatureStore
from pydantic import BaseModel

MODE = os.environ.get("FEAST_MODE", "async")
NAMES = [f"fv{v}_f{j}" for v in range(5) for j in range(8)]
REFS = [f"fv{v}:fv{v}_f{j}" for v in range(5) for j in range(8)]

store = FeatureStore(repo_path=os.environ["FEAST_REPO"])
options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
session = ort.InferenceSession(os.environ["MODEL_PATH"], options,
                               providers=["CPUExecutionProvider"])
app = FastAPI()


class PredictRequest(BaseModel):
    card: int


def _score(values: dict) -> float:
    x = np.array([[np.nan if values[n][0] is None else values[n][0] for n in NAMES]],
                 dtype=np.float32)
    return float(session.run(["probabilities"], {"input": x})[0][0, 1])


if MODE == "async":
    @app.post("/predict")
    async def predict(req: PredictRequest) -> dict:
        resp = await store.get_online_features_async(features=REFS,
                                                      entity_rows=[{"card": req.card}])
        return {"card": req.card, "probability": _score(resp.to_dict())}
elif MODE == "sync":
    @app.post("/predict")
    def predict(req: PredictRequest) -> dict:
        resp = store.get_online_features(features=REFS, entity_rows=[{"card": req.card}])
        return {"card": req.card, "probability": _score(resp.to_dict())}
else:
    raise SystemExit(f"FEAST_MODE={MODE}: use async or sync")


@app.get("/health")
async def health() -> dict:
    return {"ok": True, "mode": MODE}
