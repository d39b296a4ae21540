"""The recommender graph in Ray Serve, as a Python team would build it: the peer of redline's.

Runs in the peer's own environment (``setup_ray_serve.sh``), not redline's. The same work as the
redline graph: the session's items and the user's windows from Redis (one pipelined read), the
example's ONNX encoder, exact inner-product retrieval over ``items.npy``, the candidates' item
windows from Redis, the example's ranking features and its LightGBM ranker in ONNX Runtime over
the K candidates, drop items the session saw, top N.

    python ray_serve_app.py --artifacts DIR --redis-url redis://127.0.0.1:6379/0 --port 8600 \
        --layout three --replicas 1 --max-ongoing 8

``--layout three``: ingress -> retrieval -> ranking, composed with deployment handles (Ray
Serve's model composition); ``--layout one``: all steps in one deployment. Prints ``READY``
when it answers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[1] / "examples" / "recommend"
sys.path.insert(0, str(EXAMPLE))

from ranking import candidate_features  # noqa: E402

SESSION_ITEMS = 10
K = 100
USER_FIELDS = ("count_1d", "count_7d", "cart_sum_7d")
ITEM_FIELDS = ("count_1h", "count_1d", "count_7d", "cart_sum_1d")


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
        self.category = np.array([int(c[3:]) for c in table["category"]])
        self.price = np.asarray(table["price"], dtype=np.float64)
        self.popularity = np.asarray(table["popularity"], dtype=np.float64)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.encoder = ort.InferenceSession(str(folder / "encoder.onnx"), opts,
                                            providers=["CPUExecutionProvider"])
        self.ranker = ort.InferenceSession(str(folder / "ranker.onnx"), opts,
                                           providers=["CPUExecutionProvider"])
        self.redis = redis.Redis.from_url(redis_url)

    def context(self, user_id: str, session_id: str) -> tuple[list[int], np.ndarray]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.lrange(f"peer:session:{session_id}", 0, SESSION_ITEMS - 1)
        pipe.hmget(f"peer:user:{user_id}", *USER_FIELDS)
        items, user = pipe.execute()
        windows = np.array([float(v) if v is not None else 0.0 for v in user], dtype=np.float32)
        return [int(i) for i in items], windows

    def retrieve(self, session: list[int], user: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        padded = np.full((1, SESSION_ITEMS), len(self.items), dtype=np.int64)
        padded[0, : len(session)] = session
        query = self.encoder.run(["query"], {"session_items": padded,
                                             "user_features": user[None, :]})[0][0]
        scores = self.items @ query
        if session:
            scores[session] = -np.inf
        top = np.argpartition(-scores, K)[:K]
        top = top[np.argsort(-scores[top])]
        return top, scores[top]

    def rank(self, session: list[int], user: np.ndarray, cands: np.ndarray,
             scores: np.ndarray, n: int) -> dict:
        pipe = self.redis.pipeline(transaction=False)
        for i in cands:
            pipe.hmget(f"peer:item:{i}", *ITEM_FIELDS)
        windows = np.array([[float(v) if v is not None else 0.0 for v in row]
                            for row in pipe.execute()], dtype=np.float32)
        x = candidate_features(cands, scores, session, windows, user, self.category,
                               self.price, self.popularity)
        ranked = self.ranker.run(None, {"candidates": x})[0].reshape(-1)
        best = np.argsort(-ranked)[:n]
        return {"items": [self.item_ids[i] for i in cands[best]],
                "scores": [float(s) for s in ranked[best]]}


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
            body = await request.json()
            session, user = self.model.context(body["user_id"], body["session_id"])
            cands, scores = self.model.retrieve(session, user)
            return self.model.rank(session, user, cands, scores, body.get("n", 10))

    @serve.deployment(**opts)
    class Ranking:
        def __init__(self) -> None:
            self.model = Model(args.artifacts, args.redis_url)

        def rank(self, session: list[int], user: np.ndarray, cands: np.ndarray,
                 scores: np.ndarray, n: int) -> dict:
            return self.model.rank(session, user, cands, scores, n)

    @serve.deployment(**opts)
    class Retrieval:
        def __init__(self, ranking) -> None:  # noqa: ANN001
            self.model = Model(args.artifacts, args.redis_url)
            self.ranking = ranking

        async def recommend(self, session: list[int], user: np.ndarray, n: int) -> dict:
            cands, scores = self.model.retrieve(session, user)
            return await self.ranking.rank.remote(session, user, cands, scores, n)

    @serve.deployment(**opts)
    class Ingress:
        def __init__(self, retrieval) -> None:  # noqa: ANN001
            self.model = Model(args.artifacts, args.redis_url)
            self.retrieval = retrieval

        async def __call__(self, request: Request) -> dict:
            body = await request.json()
            session, user = self.model.context(body["user_id"], body["session_id"])
            return await self.retrieval.recommend.remote(session, user, body.get("n", 10))

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
    print("READY", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
