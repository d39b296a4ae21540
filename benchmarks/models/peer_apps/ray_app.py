"""Ray Serve's side of the Python-model comparison: rowsum and the three-step graph.

    python ray_app.py --graph-files DIR --port 8740 --replicas 1 --run-dir DIR

Runs in the ``ray-serve`` peer's environment (``bash benchmarks/peers/setup.sh ray-serve``), in
Ray Serve's throughput-optimized mode (``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: user code and router
on the replica's own loop, buffered logs, direct gRPC between replicas) behind its HAProxy
ingress (``RAY_SERVE_ENABLE_HA_PROXY=1``), access log off, ``--replicas`` replicas per deployment
(the comparison gives as many as redline has workers). Three applications, each taking V2 REST
JSON at ``/v2/models/NAME/infer`` as redline and Triton do:

- ``rowsum``: one deployment, ``OUTPUT0`` = row sums of ``INPUT0`` per request;
- ``rowsum_batched``: the same with ``@serve.batch`` (up to ``--batch`` requests, waiting at most
  ``--batch-wait-ms``): one numpy call over the batch's rows;
- ``graph``: the three steps composed with deployment handles (Ray Serve's model composition):
  the ingress parses the request and runs the featurizer, then calls the model deployment (the
  ONNX file in ONNX Runtime, one thread) and the post-step deployment.

Prints READY when every application answers; SIGTERM shuts Serve and Ray down.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "peers"))
import workload  # noqa: E402
from ray_ingress import throughput_env  # noqa: E402

QUIET = {"enable_access_log": False, "log_level": "WARNING"}


def _input(body: bytes, name: str = "INPUT0") -> np.ndarray:
    doc = json.loads(body)
    for tensor in doc["inputs"]:
        if tensor["name"] == name:
            return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    raise ValueError(f"no input {name}")


def _answer(model: str, **outputs: tuple[str, np.ndarray]):  # noqa: ANN202 - a Response
    """The V2 answer as a JSONResponse: it carries its Content-Length, which the load tool
    needs (a dict comes back chunked)."""
    from starlette.responses import JSONResponse

    return JSONResponse({"model_name": model, "outputs": [
        {"name": n, "datatype": dt, "shape": list(a.shape), "data": a.ravel().tolist()}
        for n, (dt, a) in outputs.items()]})


def build_apps(args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    opts = {"num_replicas": args.replicas, "max_ongoing_requests": args.max_ongoing,
            "ray_actor_options": {"num_cpus": 0}, "logging_config": QUIET}

    @serve.deployment(**opts)
    class RowSum:
        async def __call__(self, request: Request) -> Response:
            x = _input(await request.body())
            return _answer("rowsum", OUTPUT0=("FP32", workload.rowsum(x)))

    @serve.deployment(**opts)
    class RowSumBatched:
        async def __call__(self, request: Request) -> Response:
            x = _input(await request.body())
            return _answer("rowsum_batched", OUTPUT0=("FP32", await self.many(x)))

        @serve.batch(max_batch_size=args.batch, batch_wait_timeout_s=args.batch_wait_ms / 1000)
        async def many(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
            sums = workload.rowsum(np.concatenate(arrays))
            bounds = np.cumsum([0] + [len(a) for a in arrays])
            return [sums[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    @serve.deployment(**opts)
    class Mlp:
        def __init__(self) -> None:
            import onnxruntime as ort

            o = ort.SessionOptions()
            o.intra_op_num_threads = 1
            o.inter_op_num_threads = 1
            self.session = ort.InferenceSession(str(Path(args.graph_files) / workload.ONNX_FILE),
                                                o, providers=["CPUExecutionProvider"])

        def __call__(self, features: np.ndarray) -> np.ndarray:
            return self.session.run(None, {"FEATURES": features})[0]

    @serve.deployment(**opts)
    class Post:
        def __call__(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return workload.post(probs)

    @serve.deployment(**opts)
    class Featurize:
        def __init__(self, mlp, post) -> None:  # noqa: ANN001 - deployment handles
            c = workload.load_constants(args.graph_files)
            self.mean, self.scale = c["mean"], c["scale"]
            self.mlp, self.post = mlp, post

        async def __call__(self, request: Request) -> Response:
            features = workload.featurize(_input(await request.body()), self.mean, self.scale)
            probs = await self.mlp.remote(features)
            label, score = await self.post.remote(probs)
            return _answer("graph", LABEL=("INT64", label), SCORE=("FP32", score))

    return {"rowsum": RowSum.bind(), "rowsum_batched": RowSumBatched.bind(),
            "graph": Featurize.bind(Mlp.bind(), Post.bind())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph-files", required=True, help="workload.write_files's folder")
    ap.add_argument("--port", type=int, default=8740)
    ap.add_argument("--replicas", type=int, default=1, help="replicas per deployment")
    ap.add_argument("--max-ongoing", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8, help="@serve.batch's max_batch_size")
    ap.add_argument("--batch-wait-ms", type=float, default=1.0)
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--run-dir", type=Path, default=None)
    args = ap.parse_args()
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="rl-ray-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    # Read by Ray and Serve at import and inherited by every process Ray starts: set first.
    os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", **throughput_env(run_dir)})
    import ray
    from ray import serve

    here = str(Path(__file__).resolve().parent)  # replicas import workload.py from here
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(run_dir / "ray"), runtime_env={"env_vars": {"PYTHONPATH": here}})
    serve.start(http_options={"host": "127.0.0.1", "port": args.port}, logging_config=QUIET)
    for name, app in build_apps(args).items():
        serve.run(app, name=name, route_prefix=f"/v2/models/{name}", blocking=False,
                  logging_config=QUIET)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print("READY", flush=True)
    stopping.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
