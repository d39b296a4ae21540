"""Python models served end to end: the same edges, batching, budgets and swaps as ONNX.

One real server (REST and gRPC) serves Python models in this process and in worker processes,
beside an ONNX model; real clients (httpx, grpcio through tritonclient) talk to it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from redline.config import BatchingSettings, ModelSettings, Settings
from redline.models import ModelRepository
from tests.models import pymodels as pm
from tests.serving.helpers import ServerThread, affine_model

pytestmark = [
    pytest.mark.slow,  # starts a server and worker processes
    # Each test that provokes a model failure sees its traceback logged once, on purpose.
    pytest.mark.allow_log(r"model '(moody|moody_proc)' version 1: ",
                          r"model 'moody(_proc)?:1': a run outlived"),
]
HANG_S = 3.0
# Appends "start end" of each predict call to <count dir>/timed.txt, taking 0.3 s a call.
TIMED = '''
class Model:
    inputs = {"INPUT0": ("FP32", [-1, 16])}
    outputs = {"OUTPUT0": ("FP32", [-1])}

    def predict(self, inputs):
        start = time.time()
        time.sleep(0.3)
        with open(os.environ["REDLINE_TEST_COUNT_DIR"] + "/timed.txt", "a") as f:
            f.write(f"{start} {time.time()}\\n")
        return {"OUTPUT0": inputs["INPUT0"].sum(axis=1)}
'''


def infer_body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}


@pytest.fixture(scope="module")
def counts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("counts")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, counts: Path) -> Iterator[ServerThread]:
    tmp = tmp_path_factory.mktemp("python-models")
    old = {k: os.environ.get(k) for k in ("REDLINE_TEST_COUNT_DIR", "REDLINE_TEST_HANG_S")}
    os.environ["REDLINE_TEST_COUNT_DIR"] = str(counts)
    os.environ["REDLINE_TEST_HANG_S"] = str(HANG_S)
    repo = ModelRepository(tmp / "models")
    sample = pm.rows(4)
    for name, source in (("rowsum", pm.ROW_SUM), ("slowsum", pm.row_sum(sleep_s=0.05)),
                         ("moody", pm.MOODY), ("moody_proc", pm.MOODY), ("timed", TIMED)):
        repo.add_python(name, pm.write(tmp / "src" / name, source), sample, trust_code=True)
    repo.add_onnx("affine", affine_model())
    settings = Settings()
    settings.server.watch_repository = False
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    settings.models["moody_proc"] = ModelSettings(runtime="process", workers=2)
    settings.models["slowsum"] = ModelSettings(slo_ms=2000)  # its runs take 50 ms each
    settings.models["timed"] = ModelSettings(  # one request a batch, two processes
        slo_ms=10_000, runtime="process", workers=2, batching=BatchingSettings(enabled=False))
    server = ServerThread(settings, repo).start()
    yield server
    server.stop()
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def client(served: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.http, timeout=30) as c:
        yield c


# ---------------------------------------------------------------------- every edge
def test_rest_json_metadata_and_readiness(client: httpx.Client) -> None:
    x = pm.rows(3)
    r = client.post("/v2/models/rowsum/infer", json=infer_body(x))
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["name"] == "OUTPUT0" and out["datatype"] == "FP32" and out["shape"] == [3]
    assert np.allclose(out["data"], x.sum(axis=1), rtol=1e-6)
    assert r.json()["model_version"] == "1"
    meta = client.get("/v2/models/rowsum").json()
    assert meta["platform"] == "python"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}]
    assert client.get("/v2/models/rowsum/ready").status_code == 200
    config = client.get("/v2/models/rowsum/config").json()
    assert config["backend"] == "python" and config["max_batch_size"] == 32


def test_rest_binary_tensors(client: httpx.Client) -> None:
    x = pm.rows(5)
    header = (b'{"inputs":[{"name":"INPUT0","shape":[5,16],"datatype":"FP32",'
              b'"parameters":{"binary_data_size":%d}}],'
              b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}'
              % x.nbytes)
    r = client.post("/v2/models/rowsum/infer", content=header + x.tobytes(),
                    headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 200, r.text
    length = int(r.headers["Inference-Header-Content-Length"])
    y = np.frombuffer(r.content[length:], np.float32)
    assert np.allclose(y, x.sum(axis=1), rtol=1e-6)


def test_triton_clients_over_http_and_grpc(served: ServerThread) -> None:
    x = pm.rows(2)
    http = thttp.InferenceServerClient(served.http.removeprefix("http://"))
    grpc = tgrpc.InferenceServerClient(served.grpc)
    try:
        for client, module in ((http, thttp), (grpc, tgrpc)):
            inp = module.InferInput("INPUT0", [2, 16], "FP32")
            inp.set_data_from_numpy(x)
            y = client.infer("rowsum", [inp]).as_numpy("OUTPUT0")
            assert np.allclose(y, x.sum(axis=1), rtol=1e-6)
            bad = module.InferInput("INPUT0", [1, 16], "FP32")
            bad.set_data_from_numpy(pm.rows(1, first=13))
            with pytest.raises(InferenceServerException, match="unlucky row 0"):
                client.infer("moody", [bad])
        assert grpc.get_model_metadata("rowsum").platform == "python"
    finally:
        http.close()
        grpc.close()


# ---------------------------------------------------------------------- batching and warm-up
def test_concurrent_requests_share_one_predict_call(client: httpx.Client, served: ServerThread,
                                                    counts: Path) -> None:
    before = len(pm.counted(counts, "slowsum"))
    assert before >= 1  # warm-up ran the sample before the first request
    xs = [pm.rows(1, seed=i) for i in range(8)]

    def one(x: np.ndarray) -> list[float]:
        with httpx.Client(base_url=served.http, timeout=30) as c:
            r = c.post("/v2/models/slowsum/infer", json=infer_body(x))
            assert r.status_code == 200, r.text
            return r.json()["outputs"][0]["data"]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, xs))
    for x, answer in zip(xs, answers, strict=True):
        assert np.allclose(answer, x.sum(axis=1), rtol=1e-6)  # each its own rows back
    calls = pm.counted(counts, "slowsum")[before:]
    assert sum(calls) == 8
    assert len(calls) < 8 and max(calls) > 1, calls  # rows of queued requests ran together


def test_worker_processes_run_batches_at_once(served: ServerThread, counts: Path) -> None:
    timed = counts / "timed.txt"
    timed.unlink(missing_ok=True)  # the calls of add's check and warm-up

    def one(i: int) -> int:
        with httpx.Client(base_url=served.http, timeout=30) as c:
            return c.post("/v2/models/timed/infer", json=infer_body(pm.rows(1, seed=i))
                          ).status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, range(4))) == [200] * 4
    calls = sorted(tuple(map(float, line.split())) for line in timed.read_text().splitlines())
    assert len(calls) == 4
    overlapping = sum(1 for a, b in zip(calls, calls[1:], strict=False) if b[0] < a[1])
    assert overlapping >= 1, calls  # two processes ran calls at the same time


# ---------------------------------------------------------------------- bad answers at run time
@pytest.mark.parametrize("model", ["moody", "moody_proc"])
def test_a_raising_predict_is_a_500_model_error_others_untouched(client: httpx.Client,
                                                                 model: str) -> None:
    r = client.post(f"/v2/models/{model}/infer", json=infer_body(pm.rows(2, first=13)))
    assert r.status_code == 500
    doc = r.json()
    assert doc["code"] == "model_error"
    assert f"model '{model}' version 1: predict raised ValueError: unlucky row 0" in doc["error"]
    assert "(model.py, line" in doc["error"] and "Traceback" not in r.text
    r = client.post(f"/v2/models/{model}/infer", json=infer_body(pm.rows(2, first=7)))
    assert r.status_code == 500 and r.json()["code"] == "model_error"
    assert "output 'OUTPUT0' holds NaN" in r.json()["error"]
    ok = client.post(f"/v2/models/{model}/infer", json=infer_body(pm.rows(2)))
    assert ok.status_code == 200, ok.text
    assert client.post("/v2/models/affine/infer", json={"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    ).status_code == 200


@pytest.mark.parametrize("model", ["moody", "moody_proc"])
def test_a_hang_is_cut_by_the_budget_and_the_model_keeps_serving(client: httpx.Client,
                                                                  served: ServerThread,
                                                                  model: str) -> None:
    t0 = time.monotonic()
    r = client.post(f"/v2/models/{model}/infer", json=infer_body(pm.rows(1, first=99)),
                    headers={"x-redline-budget-ms": "300"})
    took = time.monotonic() - t0
    assert r.status_code == 504, r.text
    assert r.json()["code"] == "deadline_exceeded" and "still going" in r.json()["error"]
    assert took < HANG_S / 2, took
    # The same model answers the next request on another thread (or a fresh worker process),
    # while the hung call is still running; the health check answers too.
    t0 = time.monotonic()
    ok = client.post(f"/v2/models/{model}/infer", json=infer_body(pm.rows(1)))
    assert ok.status_code == 200, ok.text
    assert client.get("/v2/health/ready").status_code == 200
    if model == "moody_proc":  # its worker was stopped and replaced: none is left hanging
        handle = served.server.registry.get(model)
        assert handle.batcher.abandoned >= 1
    assert time.monotonic() - t0 < HANG_S


def test_a_crashing_worker_is_a_500_and_is_replaced(client: httpx.Client,
                                                     served: ServerThread) -> None:
    r = client.post("/v2/models/moody_proc/infer", json=infer_body(pm.rows(1, first=-5)),
                    headers={"x-redline-budget-ms": "5000"})
    assert r.status_code == 500 and r.json()["code"] == "model_error"
    assert "worker process exited with code 3" in r.json()["error"]
    # The other worker answers; the crashed one is replaced while it does.
    deadline = time.monotonic() + 30
    while True:
        ok = client.post("/v2/models/moody_proc/infer", json=infer_body(pm.rows(1)),
                         headers={"x-redline-budget-ms": "10000"})
        assert ok.status_code == 200, ok.text
        if served.server.registry.get("moody_proc").session._pool.size == 2:  # noqa: SLF001
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)


# ---------------------------------------------------------------------- swaps and metrics
def test_hot_swap_to_a_new_version(client: httpx.Client, served: ServerThread,
                                   tmp_path: Path) -> None:
    repo = served.server.registry.repository
    old = served.server.registry.get("rowsum")
    repo.add_python("rowsum", pm.write(tmp_path / "v2", pm.row_sum(factor=2)), pm.rows(4),
                    trust_code=True)
    served.call(served.server.registry.sync())
    x = pm.rows(1)
    doc = client.post("/v2/models/rowsum/infer", json=infer_body(x)).json()
    assert doc["model_version"] == "2"
    assert np.allclose(doc["outputs"][0]["data"], 2 * x.sum(axis=1), rtol=1e-6)
    deadline = time.monotonic() + 10
    while old.session._module is not None:  # noqa: SLF001 - the retired version let go
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_metrics_count_python_models_like_any(client: httpx.Client) -> None:
    client.post("/v2/models/rowsum/infer", json=infer_body(pm.rows(1)))
    text = client.get("/metrics").text
    assert 'model="rowsum"' in text


def test_nothing_runs_on_the_event_loop(served: ServerThread) -> None:
    """A Python model's run never happens on the loop's thread: a predict that holds the GIL
    or hangs cannot stop the server answering."""
    handle = served.server.registry.get("rowsum")
    assert handle.batcher.run_now({"INPUT0": pm.rows(1)}, 1) is None
    threads: list[int] = []
    original = handle.session._call  # noqa: SLF001

    def spy(inputs):  # type: ignore[no-untyped-def]
        threads.append(threading.get_ident())
        return original(inputs)

    handle.session._call = spy  # noqa: SLF001
    try:
        with httpx.Client(base_url=served.http, timeout=10) as c:
            assert c.post("/v2/models/rowsum/infer", json=infer_body(pm.rows(1))
                          ).status_code == 200
    finally:
        handle.session._call = original  # noqa: SLF001
    assert threads and served._thread.ident not in threads  # noqa: SLF001
