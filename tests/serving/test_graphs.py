"""General graphs served end to end: every step kind, concurrency, cascades, fallbacks, budgets.

One real server (REST and gRPC) serves several graphs beside a plain ONNX model that one of them
reads from the repository; real clients (httpx, tritonclient) talk to it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc

from redline.config import Settings
from redline.models import ModelRepository
from tests.serving.helpers import ServerThread, affine_model

pytestmark = [
    pytest.mark.slow,  # starts a server
    pytest.mark.allow_log(r"graph '(broken|fallbacks)' step"),
]

STEPS = '''
import time
import numpy as np

def pre(inputs):
    return {"x": inputs["raw"].astype(np.float32) + 1}

def post(inputs):
    return {"label": (inputs["s"] > 20).astype(np.int64)}

def nap_a(inputs):
    time.sleep(0.3)
    return {"a": inputs["raw"] * 2}

def nap_b(inputs):
    time.sleep(0.3)
    return {"b": inputs["raw"] * 3}

def join(inputs):
    return {"sum": inputs["a"] + inputs["b"]}

def cheap(inputs):
    # sure (0.95) of class 1 when the first column is positive, unsure (0.6) otherwise
    x = inputs["raw"]
    p1 = np.where(x[:, 0] > 0, 0.95, 0.6).astype(np.float32)
    return {"probabilities": np.stack([1 - p1, p1], axis=1)}

def big(inputs):
    time.sleep(0.15)
    x = inputs["raw"]
    p1 = np.where(x[:, 0] > 0, 0.99, 0.02).astype(np.float32)
    return {"probabilities": np.stack([1 - p1, p1], axis=1)}

def flaky(inputs):
    if (inputs["raw"] < 0).any():
        raise ValueError("negative input")
    return {"y": inputs["raw"] * 10}

def slow(inputs):
    time.sleep(0.2)
    return {"z": inputs["raw"] + 100}

def stuck(inputs):
    time.sleep(1.0)
    return {"w": inputs["raw"]}

def quick(inputs):
    return {"z": inputs["raw"] + 1}

def fail(inputs):
    raise RuntimeError("this step always fails")
'''

GRAPHS = {
    "chain": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  pre:
    kind: python
    function: steps.py:pre
    inputs: [raw]
    outputs: {x: {datatype: FP32, shape: [-1, 4]}}
  double:
    kind: model
    model: double.onnx
    inputs: [pre.x]
  triple:
    kind: model
    model: affine
    inputs: [pre.x]
  blend:
    kind: ensemble
    method: weighted_mean
    weights: [1, 3]
    steps: [double, triple]
    output: y
  post:
    kind: python
    function: steps.py:post
    batch: true
    inputs: [double.s]
outputs:
  label: post.label
  y: blend.y
''',
    "sleepy": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  a: {kind: python, function: "steps.py:nap_a", inputs: [raw]}
  b: {kind: python, function: "steps.py:nap_b", inputs: [raw]}
  join: {kind: python, function: "steps.py:join", inputs: [a.a, b.b]}
outputs:
  sum: join.sum
''',
    "cascade": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  cheap: {kind: python, function: "steps.py:cheap", inputs: [raw]}
  big: {kind: python, function: "steps.py:big", inputs: [raw]}
  answer:
    kind: cascade
    confidence: probabilities
    steps:
      - {step: cheap, threshold: 0.9}
      - big
outputs:
  probabilities: answer.probabilities
  answered_by: answer.answered_by
''',
    "fallbacks": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  flaky:
    kind: python
    function: steps.py:flaky
    inputs: [raw]
    fallback: {value: {y: [0, 0, 0, 0]}}
  slow:
    kind: python
    function: steps.py:slow
    inputs: [raw]
    fallback: {step: quick}
  quick: {kind: python, function: "steps.py:quick", inputs: [raw]}
outputs:
  y: flaky.y
  z: slow.z
''',
    "hangs": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  stuck:
    kind: python
    function: steps.py:stuck
    inputs: [raw]
    outputs: {w: {datatype: FP32, shape: [-1, 4]}}
    fallback: {value: {w: [7, 7, 7, 7]}}
outputs:
  w: stuck.w
''',
    "hangs_on": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  stuck:
    kind: python
    function: steps.py:stuck
    inputs: [raw]
    outputs: {w: {datatype: FP32, shape: [-1, 4]}}
outputs:
  w: stuck.w
''',
    "broken": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  fail: {kind: python, function: "steps.py:fail", inputs: [raw]}
outputs:
  out: fail.out
''',
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("graphs")
    repo = ModelRepository(root / "repo")
    repo.add_onnx("affine", affine_model(4, 3.0, 0.0))
    sample = np.ones((2, 4), np.float32)
    for name, text in GRAPHS.items():
        folder = root / name
        folder.mkdir()
        (folder / "graph.yaml").write_text(text)
        (folder / "steps.py").write_text(STEPS)
        (folder / "double.onnx").write_bytes(affine_model(4, 2.0, 0.0))
        if name == "broken":
            _add_broken(repo, folder)
        else:
            repo.add_graph(name, folder, trust_code=True,
                           sample=None if name.startswith("hangs") else sample)
    settings = Settings()
    settings.server.watch_repository = False
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    settings.pipeline.probe_interval_ms = 600_000  # no probes: a budget decision is kept
    server = ServerThread(settings, repo).start()
    yield server
    server.stop()


def _add_broken(repo: ModelRepository, folder: Path) -> None:
    """A graph whose one step always raises: its output is declared, since no run shows it."""
    text = (folder / "graph.yaml").read_text().replace(
        '"steps.py:fail", inputs: [raw]}',
        '"steps.py:fail", inputs: [raw], outputs: {out: {datatype: FP32, shape: [-1]}}}')
    (folder / "graph.yaml").write_text(text)
    repo.add_graph("broken", folder, trust_code=True)


def infer(served: ServerThread, model: str, x: np.ndarray, budget_ms: float | None = None,
          client: httpx.Client | None = None) -> httpx.Response:
    body = {"inputs": [{"name": "raw", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}
    headers = {"x-redline-budget-ms": str(budget_ms)} if budget_ms else {}
    http = client or httpx
    return http.post(f"{served.http}/v2/models/{model}/infer", json=body, headers=headers,
                     timeout=30)


def outputs(resp: httpx.Response) -> dict[str, np.ndarray]:
    assert resp.status_code == 200, resp.text
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in resp.json()["outputs"]}


def expected_chain(x: np.ndarray) -> dict[str, np.ndarray]:
    pre = x + 1
    return {"label": (pre.sum(axis=1) > 20).astype(np.int64),  # double.s: the row sum
            "y": (pre * 2 * 1 + pre * 3 * 3) / 4}


def test_a_chain_of_python_model_ensemble_and_repository_steps(served: ServerThread) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = outputs(infer(served, "chain", x))
    want = expected_chain(x)
    assert got["label"].tolist() == want["label"].tolist()
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6)
    meta = httpx.get(f"{served.http}/v2/models/chain").json()
    assert meta["platform"] == "ensemble"
    stats = httpx.get(f"{served.http}/v2/models/chain/stats").json()
    assert stats["served"] >= 1 and stats["rows"] >= 2
    assert [i["name"] for i in meta["inputs"]] == ["raw"]
    assert [o["name"] for o in meta["outputs"]] == ["label", "y"]


def test_a_graph_over_grpc_and_binary_rest(served: ServerThread) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    client = tgrpc.InferenceServerClient(served.grpc)
    inp = tgrpc.InferInput("raw", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("chain", [inp])
    want = expected_chain(x)
    assert result.as_numpy("label").tolist() == want["label"].tolist()
    np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-6)
    meta = client.get_model_metadata("chain")
    assert meta.platform == "ensemble" and [i.name for i in meta.inputs] == ["raw"]
    client.close()
    import tritonclient.http as thttp

    hclient = thttp.InferenceServerClient(served.http.removeprefix("http://"))
    hin = thttp.InferInput("raw", list(x.shape), "FP32")
    hin.set_data_from_numpy(x, binary_data=True)
    hres = hclient.infer("chain", [hin],
                         outputs=[thttp.InferRequestedOutput("y", binary_data=True)])
    np.testing.assert_allclose(hres.as_numpy("y"), want["y"], rtol=1e-6)
    hclient.close()


def test_concurrent_requests_share_step_runs_and_get_their_own_answers(
        served: ServerThread) -> None:
    handle = served.server.registry.get("chain")
    batcher = handle._python["post"]  # noqa: SLF001 - the batch: true step's batcher
    before = batcher.stats.as_dict()
    xs = [np.full((1 + i % 3, 4), i, dtype=np.float32) for i in range(64)]
    with httpx.Client() as client, ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda x: outputs(infer(served, "chain", x, client=client)),
                                xs))
    for x, got in zip(xs, answers, strict=True):
        want = expected_chain(x)
        assert got["label"].tolist() == want["label"].tolist(), (x, got)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6)
    after = batcher.stats.as_dict()
    requests = after["served"] - before["served"]
    assert requests == 64
    assert after["batches"] - before["batches"] < requests  # some rode one run together


def test_independent_steps_run_at_once(served: ServerThread) -> None:
    x = np.ones((1, 4), np.float32)
    outputs(infer(served, "sleepy", x, budget_ms=5000))  # first runs: threads started
    t0 = time.perf_counter()
    got = outputs(infer(served, "sleepy", x, budget_ms=5000))
    took = time.perf_counter() - t0
    assert got["sum"].tolist() == [[5.0] * 4]
    assert took < 0.55, f"two 0.3 s steps took {took:.2f} s: they ran one after the other"


def test_a_cascade_answers_at_each_step_and_by_the_budget(served: ServerThread) -> None:
    x = np.array([[1, 0, 0, 0], [-1, 0, 0, 0]], np.float32)
    got = outputs(infer(served, "cascade", x, budget_ms=5000))
    assert got["answered_by"].tolist() == ["cheap", "big"]
    np.testing.assert_allclose(got["probabilities"][:, 1], [0.95, 0.02], rtol=1e-6)
    sure = outputs(infer(served, "cascade", x[:1], budget_ms=5000))
    assert sure["answered_by"].tolist() == ["cheap"]
    # big's recent p99 (~150 ms) is above this budget: the cheap step answers every row
    rushed = outputs(infer(served, "cascade", x, budget_ms=100))
    assert rushed["answered_by"].tolist() == ["cheap", "cheap"]
    np.testing.assert_allclose(rushed["probabilities"][:, 1], [0.95, 0.6], rtol=1e-6)


def test_fallbacks_answer_flagged_degraded_with_the_reason(served: ServerThread) -> None:
    good = outputs(infer(served, "fallbacks", np.ones((2, 4), np.float32), budget_ms=5000))
    assert good["degraded"].tolist() == ["", ""]
    assert good["y"].tolist() == [[10.0] * 4] * 2
    bad = outputs(infer(served, "fallbacks", -np.ones((2, 4), np.float32), budget_ms=5000))
    assert bad["y"].tolist() == [[0.0] * 4] * 2  # the constant fallback
    reason = bad["degraded"][0]
    assert "step 'flaky'" in reason and "negative input" in reason
    assert good["z"].tolist() == [[101.0] * 4] * 2
    # slow's p99 (~200 ms) does not fit 120 ms: it is skipped for quick's answer
    rushed = outputs(infer(served, "fallbacks", np.ones((1, 4), np.float32), budget_ms=120))
    assert rushed["z"].tolist() == [[2.0] * 4]
    assert "step 'slow' skipped" in rushed["degraded"][0]
    assert "below its recent p99" in rushed["degraded"][0]


def test_a_step_past_the_deadline_falls_back_else_the_request_is_late(
        served: ServerThread) -> None:
    x = np.ones((1, 4), np.float32)
    t0 = time.perf_counter()
    got = outputs(infer(served, "hangs", x, budget_ms=200))
    assert time.perf_counter() - t0 < 0.8  # answered at the deadline, not after the 1 s run
    assert got["w"].tolist() == [[7.0] * 4]
    assert "step 'stuck' failed (deadline_exceeded)" in got["degraded"][0]
    resp = infer(served, "hangs_on", x, budget_ms=200)
    assert resp.status_code == 504 and resp.json()["code"] == "deadline_exceeded"


def test_a_step_that_raises_is_a_model_error_and_others_are_untouched(
        served: ServerThread) -> None:
    resp = infer(served, "broken", np.ones((1, 4), np.float32))
    assert resp.status_code == 500
    body = resp.json()
    assert body["code"] == "model_error"
    assert "step 'fail'" in body["error"] and "this step always fails" in body["error"]
    assert "steps.py, line" in body["error"]
    x = np.ones((1, 4), np.float32)
    assert outputs(infer(served, "chain", x))["label"].tolist() == [0]
    plain = httpx.post(f"{served.http}/v2/models/affine/infer", json={"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    assert plain.status_code == 200


def test_each_step_is_a_stage_of_the_request(served: ServerThread) -> None:
    from redline.models.dag import GraphRun
    from redline.serving.dag import _RequestEnv
    from redline.serving.stages import RequestRecord

    handle = served.server.registry.get("chain")
    record = RequestRecord("v2", "rest")
    x = np.ones((1, 4), np.float32)

    async def run() -> None:
        await handle.infer({"raw": x}, None, record=record)

    served.call(run())
    stages = record.timings_us()
    for step in ("pre", "double", "triple", "blend", "post"):
        assert f"step:{step}" in stages
    assert "inference" in stages
    assert GraphRun and _RequestEnv  # the types the stages come from


def test_step_stages_reach_the_metrics(served: ServerThread) -> None:
    x = np.ones((1, 4), np.float32)
    for _ in range(3):
        outputs(infer(served, "chain", x))
    deadline = time.time() + 10
    text = ""
    while time.time() < deadline:  # the monitor folds finished requests on its tick
        text = httpx.get(f"{served.http}/metrics").text
        if 'stage="step:post"' in text:
            break
        time.sleep(0.2)
    for step in ("pre", "double", "triple", "blend", "post"):
        assert f'stage="step:{step}"' in text


def test_a_new_graph_version_swaps_in_like_a_model(served: ServerThread, tmp_path) -> None:
    repo = served.server.registry.repository
    folder = tmp_path / "swap"
    folder.mkdir()
    (folder / "steps.py").write_text(STEPS)
    x = np.ones((1, 4), np.float32)
    for version, step in ((1, "pre"), (2, "quick")):
        output = "x" if step == "pre" else "z"
        (folder / "graph.yaml").write_text(f"""
inputs:
  raw: {{datatype: FP32, shape: [-1, 4]}}
steps:
  only: {{kind: python, function: "steps.py:{step}", inputs: [raw]}}
outputs:
  out: only.{output}
""")
        repo.add_graph("swap", folder, trust_code=True, sample=x)
        served.call(served.server.registry.sync(["swap"]))
        resp = infer(served, "swap", x)
        assert resp.json()["model_version"] == str(version)
        assert outputs(resp)["out"].tolist() == [[2.0] * 4]  # raw + 1 both ways
