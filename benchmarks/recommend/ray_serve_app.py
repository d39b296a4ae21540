"""The recommender graph in Ray Serve, as a Python team would build it: the peer of redline's.

Runs in the peer's own environment (``setup_ray_serve.sh``), not redline's. The same work as the
example's ``graph.yaml``: the session's last items and the user's windows from Redis, the items'
recency-weighted sum over ``items.npy`` as the query, exact top-K by inner product, the
example's ranking features and LightGBM ranker in ONNX Runtime over the K candidates in one run,
drop the items the session saw, top 10.

    python ray_serve_app.py --artifacts DIR --redis-url redis://127.0.0.1:6379/0 --port 8600 \
        --layout three --replicas 1 --max-ongoing 8

``--layout three``: ingress -> retrieval -> ranking, composed with deployment handles (Ray
Serve's model composition); ``--layout one``: all steps in one deployment. The request body is
``{"session_id": ..., "entities": {"user_id": ...}}``, as redline's ``/v1`` takes it; the
user's windows are a Redis hash per user.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[1] / "examples" / "recommend"
sys.path.insert(0, str(EXAMPLE))

from ranking import ITEM_COLUMNS, candidate_features  # noqa: E402

SESSION_ITEMS = 10
RECENCY = 0.8
K = 100
TOP_N = 10
USER_WINDOWS = ("count_1d", "count_7d", "cart_sum_7d")  # the ranker's user features, in order


class Model:
    """Artifacts and the steps, shared by both layouts."""

    def __init__(self, artifacts: str, redis_url: str) -> None:
        import onnxruntime as ort
        import pyarrow.parquet as pq
        import redis

        folder = Path(artifacts)
        self.items = np.load(folder / "items.npy")
        table = pq.read_table(folder / "items.parquet").to_pydict()
        self.item_ids = table["item_id"]
        self.columns = np.column_stack([table[c] for c in ITEM_COLUMNS]).astype(np.float32)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.ranker = ort.InferenceSession(str(folder / "ranker.onnx"), opts,
                                           providers=["CPUExecutionProvider"])
        self.redis = redis.Redis.from_url(redis_url)

    def context(self, body: dict) -> tuple[list[int], np.ndarray]:
        """The session's last items and the user's windows, in one Redis round trip."""
        user_id = body.get("entities", {}).get("user_id", "")
        pipe = self.redis.pipeline(transaction=False)
        pipe.lrange(f"peer:session:{body['session_id']}", 0, SESSION_ITEMS - 1)
        pipe.hmget(f"peer:user:{user_id}", *USER_WINDOWS)
        items, user = pipe.execute()
        windows = np.array([float(v) if v is not None else 0.0 for v in user], dtype=np.float32)
        return [int(i) for i in items], windows

    def retrieve(self, session: list[int]) -> tuple[np.ndarray, np.ndarray]:
        weights = (RECENCY ** np.arange(len(session))).astype(np.float32)
        query = (self.items[session] * weights[:, None]).sum(axis=0)
        scores = self.items @ query
        top = np.argpartition(-scores, K)[:K]
        top = top[np.argsort(-scores[top])]
        return top, scores[top]

    def rank(self, session: list[int], user: np.ndarray, cands: np.ndarray,
             scores: np.ndarray) -> dict:
        x = candidate_features(cands, scores, len(session), self.columns, user)
        ranked = self.ranker.run(None, {"candidates": x})[0].reshape(-1)
        seen = set(session)
        out = [(int(cands[i]), float(ranked[i])) for i in np.argsort(-ranked, kind="stable")
               if int(cands[i]) not in seen][:TOP_N]
        return {"items": [{"item_id": self.item_ids[i], "score": s} for i, s in out]}


def build_app(args: argparse.Namespace):  # noqa: ANN201 - ray is imported lazily
    from ray import serve
    from starlette.requests import Request

    opts = {"num_replicas": args.replicas, "max_ongoing_requests": args.max_ongoing,
            "ray_actor_options": {"num_cpus": 0}}

    @serve.deployment(**opts)
    class Recommend:
        """All steps in one deployment."""

        def __init__(self) -> None:
            self.model = Model(args.artifacts, args.redis_url)

        async def __call__(self, request: Request) -> dict:
            session, user = self.model.context(await request.json())
            cands, scores = self.model.retrieve(session)
            return self.model.rank(session, user, cands, scores)

    @serve.deployment(**opts)
    class Ranking:
        def __init__(self) -> None:
            self.model = Model(args.artifacts, args.redis_url)

        def rank(self, session: list[int], user: np.ndarray, cands: np.ndarray,
                 scores: np.ndarray) -> dict:
            return self.model.rank(session, user, cands, scores)

    @serve.deployment(**opts)
    class Retrieval:
        def __init__(self, ranking) -> None:  # noqa: ANN001
            self.model = Model(args.artifacts, args.redis_url)
            self.ranking = ranking

        async def recommend(self, session: list[int], user: np.ndarray) -> dict:
            cands, scores = self.model.retrieve(session)
            return await self.ranking.rank.remote(session, user, cands, scores)

    @serve.deployment(**opts)
    class Ingress:
        def __init__(self, retrieval) -> None:  # noqa: ANN001
            self.model = Model(args.artifacts, args.redis_url)
            self.retrieval = retrieval

        async def __call__(self, request: Request) -> dict:
            session, user = self.model.context(await request.json())
            return await self.retrieval.recommend.remote(session, user)

    if args.layout == "one":
        return Recommend.bind()
    return Ingress.bind(Retrieval.bind(Ranking.bind()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--port", type=int, default=8600)
    parser.add_argument("--layout", choices=["one", "three"], default="three")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--max-ongoing", type=int, default=8)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    import ray
    from ray import serve

    # Replicas are other processes: they import the example's ranking features from its folder.
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(EXAMPLE)}})
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(build_app(args), route_prefix="/recommend", blocking=False)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print("READY", flush=True)
    stopping.wait()
    serve.shutdown()  # the actors are processes of their own: end them before leaving
    ray.shutdown()


if __name__ == "__main__":
    main()
