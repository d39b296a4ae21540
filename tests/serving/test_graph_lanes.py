"""A graph's two lanes: every step run at once on the loop (``GraphHandle.infer_now``) when every
step's batcher is idle, else each step through its batcher (``infer_queued``). Both answer the
same and leave the same stages; under load a busy step's batcher still shares its runs.

In process, on the main thread: the inline guard lets a Python step run on the loop only there
(``serving/inline_guard.py``), and pytest-timeout's SIGALRM is lent to it for each test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import numpy as np
import orjson
import pytest

from redline.config import Settings
from redline.models import ModelRepository
from redline.monitoring.monitor import RecordFeed
from redline.monitoring.stage_times import SPILL_ROWS
from redline.serving.app import RestApp
from redline.serving.dag import GraphHandle
from redline.serving.deadline import LOW, now
from redline.serving.observers import Observers
from redline.serving.registry import ModelRegistry
from redline.serving.stages import RequestRecord
from tests.monitoring.helpers import idle_monitor
from tests.serving.helpers import affine_model, lend_sigalrm

pytestmark = pytest.mark.allow_log(r"graph '(every|plain)' step '(flaky|shy)' raised")

STEPS = '''
import time
import numpy as np

def pre(inputs):
    return {"x": inputs["raw"].astype(np.float32) + 1}

def flaky(inputs):
    if (inputs["raw"] < 0).any():
        raise ValueError("negative input")
    return {"y": inputs["raw"] * 10}

def cheap(inputs):
    p1 = np.where(inputs["x"][:, 0] > 1, 0.95, 0.6).astype(np.float32)
    return {"probabilities": np.stack([1 - p1, p1], axis=1)}

def sure(inputs):
    p1 = np.where(inputs["x"][:, 0] > 1, 0.99, 0.02).astype(np.float32)
    return {"probabilities": np.stack([1 - p1, p1], axis=1)}

def post(inputs):
    return {"label": (inputs["s"] > 20).astype(np.int64)}

def slow(inputs):
    time.sleep(0.02)
    return {"z": inputs["x"] * 2}

def shy(inputs):
    raw = inputs["raw"]
    if (raw < 0).any():
        raise ValueError("negative input")
    if (raw > 100).any():
        return {"other": raw}  # not what the graph reads
    return {"kept": raw * 3}
'''

GRAPHS = {
    # every step kind: Python steps, an in-folder and a repository model, an ensemble, a
    # cascade, a fallback
    "every": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  pre:
    kind: python
    function: steps.py:pre
    inputs: [raw]
    outputs: {x: {datatype: FP32, shape: [-1, 4]}}
  double: {kind: model, model: double.onnx, inputs: [pre.x]}
  triple: {kind: model, model: affine, inputs: [pre.x]}
  blend:
    kind: ensemble
    method: weighted_mean
    weights: [1, 3]
    steps: [double, triple]
    output: y
  flaky:
    kind: python
    function: steps.py:flaky
    inputs: [raw]
    fallback: {value: {y: [0, 0, 0, 0]}}
  cheap: {kind: python, function: "steps.py:cheap", inputs: [pre.x]}
  sure: {kind: python, function: "steps.py:sure", inputs: [pre.x]}
  answer:
    kind: cascade
    confidence: probabilities
    steps: [{step: cheap, threshold: 0.9}, sure]
  post: {kind: python, function: "steps.py:post", batch: true, inputs: [double.s]}
outputs:
  label: post.label
  y: blend.y
  flagged: flaky.y
  probabilities: answer.probabilities
  answered_by: answer.answered_by
''',
    # a chain whose middle step is too slow for the loop: it runs on a worker thread
    "slowchain": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  pre: {kind: python, function: "steps.py:pre", batch: true, inputs: [raw]}
  slow: {kind: python, function: "steps.py:slow", batch: true, inputs: [pre.x]}
  double: {kind: model, model: double.onnx, inputs: [slow.z]}
outputs:
  z: slow.z
  s: double.s
''',
    # no fallback, no cascade: on the spot it runs in one loop (``GraphRun.answer_plain``)
    "plain": '''
inputs:
  raw: {datatype: FP32, shape: [-1, 4]}
steps:
  pre:
    kind: python
    function: steps.py:pre
    inputs: [raw]
    outputs: {x: {datatype: FP32, shape: [-1, 4]}}
  double: {kind: model, model: double.onnx, inputs: [pre.x]}
  triple: {kind: model, model: affine, inputs: [pre.x]}
  blend: {kind: ensemble, method: mean, steps: [double, triple], output: y}
  shy: {kind: python, function: "steps.py:shy", inputs: [raw]}
  post: {kind: python, function: "steps.py:post", batch: true, inputs: [double.s]}
outputs:
  label: post.label
  y: blend.y
  kept: shy.kept
''',
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    root = tmp_path_factory.mktemp("lanes")
    repo = ModelRepository(root / "repo")
    repo.add_onnx("affine", affine_model(4, 3.0, 0.0))
    for name, text in GRAPHS.items():
        folder = root / name
        folder.mkdir()
        (folder / "graph.yaml").write_text(text)
        (folder / "steps.py").write_text(STEPS)
        (folder / "double.onnx").write_bytes(affine_model(4, 2.0, 0.0))
        repo.add_graph(name, folder, trust_code=True, sample=np.ones((2, 4), np.float32))
    return repo


@pytest.fixture(autouse=True)
def sigalrm_free() -> Iterator[None]:
    with lend_sigalrm():
        yield


@pytest.fixture
async def registry(repository: ModelRepository) -> AsyncIterator[ModelRegistry]:
    settings = Settings()
    settings.server.watch_repository = False
    settings.runtime.warmup_batch_sizes = [1]
    settings.runtime.warmup_runs = 1
    registry = ModelRegistry(repository, settings)
    await registry.sync()
    # A busy test machine can pause a quick step for milliseconds, and its guard would then
    # keep it off the loop a while: the quick steps get a second; the slow one keeps 5 ms.
    for name in GRAPHS:
        handle = registry.get(name)
        assert isinstance(handle, GraphHandle)
        for step, batcher in handle._python.items():  # noqa: SLF001
            if step != "slow":
                batcher._guard.limit_s = 1.0  # type: ignore[union-attr]  # noqa: SLF001
    yield registry
    await registry.close()


def stages(record: RequestRecord) -> list[str]:
    return [span[0] for span in record.spans]


async def test_on_the_spot_and_queued_answer_alike_with_the_same_stages(
        registry: ModelRegistry) -> None:
    handle = registry.get("every")
    assert isinstance(handle, GraphHandle)
    # A recent p99 is kept for the steps it steers: flaky's fallback, the cascade's 'sure'.
    windows = handle._p99  # noqa: SLF001
    assert set(windows) == {"flaky", "sure"}
    for x in (np.arange(8, dtype=np.float32).reshape(2, 4), -np.ones((3, 4), np.float32)):
        inputs, rows = handle.prepare({"raw": x})
        spot, queued = RequestRecord("v2", "rest"), RequestRecord("v2", "rest")
        seen = len(windows["flaky"]._seconds)  # noqa: SLF001
        got = handle.infer_now(inputs, rows, spot, now() + 5)
        assert got is not None  # every step's batcher was idle: it answered on the spot
        assert len(windows["flaky"]._seconds) == seen + 1  # noqa: SLF001 - (its failure too)
        want = await handle.infer_queued(inputs, rows, now() + 5, LOW, queued)
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert sorted(stages(spot)) == sorted(stages(queued))
        assert {f"step:{s}" for s in ("pre", "double", "triple", "blend", "flaky", "cheap",
                                      "answer", "post")} <= set(stages(spot))
        assert stages(spot)[-1] == "inference"
        assert (spot.path, spot.attributes) == (queued.path, queued.attributes)
    assert spot.path == "fallback"  # the negative rows: flaky's constant, flagged
    assert "step 'flaky' failed" in got["degraded"][0]
    assert got["flagged"].tolist() == [[0.0] * 4] * 3


async def test_a_plain_graph_answers_in_one_loop_as_its_steps_would(
        registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph with no fallback and no cascade runs on the spot without the coroutine: the
    same answers, stages and step observations as the queued lane, and the same errors."""
    from redline.models.dag import GraphRun

    plain = registry.get("plain")
    assert isinstance(plain, GraphHandle)
    assert plain.dag.schedule.plain and not registry.get("every").dag.schedule.plain
    # This test is of the spot: a loaded machine's run-time estimates must not queue a step.
    for step in plain.dag.spec.steps.values():
        if step.kind == "python":
            monkeypatch.setattr(plain._python[step.name], "_inline_max_s", 10.0)  # noqa: SLF001
        elif step.kind == "model":
            monkeypatch.setattr(plain._model(step).batcher, "_inline_max_s", 10.0)  # noqa: SLF001

    def no_coroutine(*args: object, **kwargs: object) -> None:
        raise AssertionError("a plain graph on the spot went through GraphRun.answer")

    # nothing in a plain graph steers by a step's recent p99: none is kept
    assert plain._p99 == {}  # noqa: SLF001
    for x in (np.arange(8, dtype=np.float32).reshape(2, 4), np.ones((1, 4), np.float32)):
        inputs, rows = plain.prepare({"raw": x})
        spot, queued = RequestRecord("v2", "rest"), RequestRecord("v2", "rest")
        with monkeypatch.context() as m:
            m.setattr(GraphRun, "answer", no_coroutine)
            got = plain.infer_now(inputs, rows, spot, now() + 5)
        assert got is not None
        want = await plain.infer_queued(inputs, rows, now() + 5, LOW, queued)
        assert got.keys() == want.keys() == {"label", "y", "kept"}
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        np.testing.assert_allclose(got["y"], (x + 1) * 2.5)  # mean of (x+1)*2 and (x+1)*3
        np.testing.assert_array_equal(got["kept"], x * 3)
        assert sorted(stages(spot)) == sorted(stages(queued))  # (queued: branches at once)
        assert stages(spot) == [f"step:{s}" for s in plain.dag.spec.order] + ["inference"]
        assert spot.path == "primary" and spot.attributes is None
    for bad, says in ((-np.ones((1, 4), np.float32), "raised ValueError"),
                      (np.full((1, 4), 200, np.float32), "reads 'shy.kept' but step 'shy' "
                                                         "returned no 'kept'")):
        inputs, rows = plain.prepare({"raw": bad})
        with pytest.raises(Exception) as on_the_spot:
            plain.infer_now(inputs, rows, None, now() + 5)
        with pytest.raises(Exception) as in_turn:
            await plain.infer_queued(inputs, rows, now() + 5, LOW, None)
        assert type(on_the_spot.value) is type(in_turn.value)
        assert getattr(on_the_spot.value, "code", None) == "model_error"
        assert str(on_the_spot.value) == str(in_turn.value)
        assert says in str(on_the_spot.value)
    inputs, rows = plain.prepare({"raw": np.ones((1, 4), np.float32)})
    with pytest.raises(Exception) as late:
        plain.infer_now(inputs, rows, None, now() - 1)
    assert getattr(late.value, "code", None) == "deadline_exceeded"


async def test_a_spent_budget_degrades_or_fails_alike_on_the_spot(
        registry: ModelRegistry) -> None:
    handle = registry.get("every")
    inputs, rows = handle.prepare({"raw": np.ones((1, 4), np.float32)})
    with pytest.raises(Exception) as spot:
        handle.infer_now(inputs, rows, None, now() - 1)
    with pytest.raises(Exception) as queued:
        await handle.infer_queued(inputs, rows, now() - 1, LOW, None)
    assert type(spot.value) is type(queued.value)
    assert getattr(spot.value, "code", None) == "deadline_exceeded"


async def test_the_rest_edge_answers_a_graph_at_once_with_its_steps_on_the_record(
        registry: ModelRegistry) -> None:
    records: list[RequestRecord] = []

    class Keep:
        def request_finished(self, record: RequestRecord) -> None:
            records.append(record)

    app = RestApp(registry, registry.settings, Observers([Keep()]))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    body = orjson.dumps({"inputs": [{"name": "raw", "datatype": "FP32", "shape": [2, 4],
                                     "data": x.ravel().tolist()}]})
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    answers: list[tuple[int, bytes]] = []
    later = app.infer_inline("/v2/models/every/infer", headers, body,
                             lambda status, payload, _: answers.append((status, payload)))
    assert later is None and answers[0][0] == 200  # answered from the parser's callback
    outputs = {o["name"]: o["data"] for o in orjson.loads(answers[0][1])["outputs"]}
    assert outputs["answered_by"] == ["sure", "cheap"]
    (record,) = records
    assert stages(record)[0] == "decode" and stages(record)[-2:] == ["inference", "encode"]
    assert "step:post" in stages(record) and "step:answer" in stages(record)


@pytest.mark.allow_log(r"model 'slowchain:slow': a run on the event loop")
async def test_concurrent_requests_still_share_a_busy_steps_runs(
        registry: ModelRegistry) -> None:
    handle = registry.get("slowchain")
    slow = handle._python["slow"]  # noqa: SLF001 - the busy step's batcher
    before = slow.stats.as_dict()
    xs = [np.full((1 + i % 3, 4), i, dtype=np.float32) for i in range(12)]
    records = [RequestRecord("v2", "rest") for _ in xs]
    # The first request starts on the spot; its slow step is stopped on the loop and it goes
    # to the queued lane, where every other request finds that step busy and waits with it.
    answers = await asyncio.gather(*(handle.infer({"raw": x}, now() + 10, record=r)
                                     for x, r in zip(xs, records, strict=True)))
    for x, got in zip(xs, answers, strict=True):
        np.testing.assert_allclose(got["z"], (x + 1) * 2)
        np.testing.assert_allclose(got["s"], ((x + 1) * 2).sum(axis=1))  # double.s: row sums
    after = slow.stats.as_dict()
    assert after["served"] - before["served"] == len(xs)
    assert after["batches"] - before["batches"] < len(xs)  # rows of several requests, one run
    for record in records:  # the stopped first try left no stages behind
        assert [s for s in stages(record) if s.startswith("step:")] == [
            "step:pre", "step:slow", "step:double"]



class _RecordsOnly:
    """The monitor's feed behind an observer that keeps no stage times: every request then
    hands over its record, as before graphs left rows."""

    def __init__(self, feed: RecordFeed) -> None:
        self.feed = feed

    def request_finished(self, record: RequestRecord) -> None:
        self.feed.request_finished(record)


async def _send(app: RestApp, model: str, x: np.ndarray, request_id: str | None = None) -> int:
    body = {"inputs": [{"name": "raw", "datatype": "FP32", "shape": list(x.shape),
                        "data": x.ravel().tolist()}]}
    if request_id is not None:
        body["id"] = request_id
    payload = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(payload)).encode())]
    statuses: list[int] = []
    later = app.infer_inline(f"/v2/models/{model}/infer", headers, payload,
                             lambda status, _body, _headers: statuses.append(status))
    if later is not None:  # queued: the ASGI app finishes it
        async def send(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(int(message["status"]))  # type: ignore[call-overload]

        await later({}, None, send)  # type: ignore[arg-type]
    return statuses[0]


async def test_common_graph_requests_leave_rows_that_fold_as_their_records_did(
        registry: ModelRegistry) -> None:
    """Past a spill, on the spot and queued, with a cascade's step left out and requests that
    must keep their record (degraded, named): each stage counts exactly the requests that ran
    it, as when every request handed over its record."""
    settings = Settings()
    settings.monitoring.trace_sample_ratio = 0.0
    rows_monitor, records_monitor = idle_monitor(settings), idle_monitor(settings)
    apps = {"rows": RestApp(registry, registry.settings, Observers([rows_monitor.feed])),
            "records": RestApp(registry, registry.settings,
                               Observers([_RecordsOnly(records_monitor.feed)]))}
    sure, unsure = np.ones((1, 4), np.float32), np.zeros((2, 4), np.float32)  # cheap answers / not
    for app in apps.values():
        for i in range(SPILL_ROWS + 40):
            assert await _send(app, "every", sure if i % 3 else unsure) == 200
        assert await _send(app, "every", -np.ones((1, 4), np.float32)) == 200  # degraded
        assert await _send(app, "every", sure, request_id="r1") == 200
        for _ in range(3):  # the slow step is stopped on the loop: the queued lane runs it
            assert await _send(app, "slowchain", sure) == 200
    kept = rows_monitor.feed.records
    assert len(kept) == 2 and {r.path for r in kept} == {"fallback", "primary"}
    assert rows_monitor.feed.stage_series[("v2", "rest", "every", "1")].held() == SPILL_ROWS + 40
    assert rows_monitor.feed.stage_series[("v2", "rest", "slowchain", "1")].held() == 3
    want = SPILL_ROWS + 40 + 2 + 3
    assert rows_monitor.drain() == want
    records_monitor.drain()  # (its feed folded most records as they came)
    for monitor in (rows_monitor, records_monitor):
        monitor.metrics.settle()
    for model in ("every", "slowchain"):
        rows = rows_monitor.metrics.series[("v2", model, "1")]
        records = records_monitor.metrics.series[("v2", model, "1")]
        assert rows.requests == records.requests
        counts = {stage: sum(t.counts) for stage, t in rows.timings.items()}
        assert counts == {stage: sum(t.counts) for stage, t in records.timings.items()}
        assert counts["total"] == sum(rows.requests.values())
    every = {s: sum(t.counts) for s, t in rows_monitor.metrics.series[("v2", "every", "1")]
             .timings.items()}
    unsure_sent = len([i for i in range(SPILL_ROWS + 40) if not i % 3])
    assert every["step:sure"] == unsure_sent + 1  # + the degraded request's (x + 1 = 0)
    assert every["step:cheap"] == every["step:pre"] == SPILL_ROWS + 40 + 2


async def test_an_in_folder_model_step_takes_its_settings_under_graph_dot_step(
        repository: ModelRepository, tmp_path) -> None:
    """``models.<graph>.<step>`` in ``redline.yaml`` reaches that step's own handle (its
    batcher's inline limit here) and no other graph's step of the same name."""
    from redline.config import load_settings

    config = tmp_path / "redline.yaml"
    config.write_text("models:\n  plain.double:\n    batching: {inline_max_us: 4000}\n")
    settings = load_settings(config, environ={})
    settings.server.watch_repository = False
    settings.runtime.warmup_batch_sizes = [1]
    registry = ModelRegistry(repository, settings)
    await registry.sync()
    try:
        limits = {}
        for name in ("plain", "every"):
            handle = registry.get(name)
            assert isinstance(handle, GraphHandle)
            limits[name] = handle._local["double"].batcher._inline_max_s  # noqa: SLF001
    finally:
        await registry.close()
    assert limits == {"plain": 4000e-6, "every": 120e-6}
