"""The request-path warm-up (``serving/warmup.py``) runs the real path and leaves no trace:
every stats and metrics endpoint reads the same before and after it, on the memory store and on
Redis, with monitoring, caches and sessions on; and it does its work (the memory store's entities
are merged, the private app answered every model)."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from redline.serving.http_protocol import RedlineHttpProtocol
from redline.serving.warmup import _present_ids, warm_request_path
from tests.pipeline.conftest import make_settings

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

TOKEN = "warm-token"
ENDPOINTS = ["/v1/pipeline/stats", "/metrics", "/v1/monitoring/summary",
             "/v2/models/cards/stats", "/v2/models/cards_small/stats",
             "/v1/models/cards/drift", "/v1/models/cards/quality",
             "/v1/debug/slow", "/v1/review", "/v2/health/ready"]
# Values that move by themselves between two reads (clocks, process gauges), not by requests.
VOLATILE_METRICS = re.compile(rb"^(process_|python_gc|redline_uptime|redline_build)")
VOLATILE_KEYS = {"now", "t", "dt", "uptime_s", "generated_at", "age_s", "timestamp"}


def normal(doc: Any) -> Any:
    """``doc`` without clocks; the monitor's per-tick ``history`` as the set of distinct ticks
    (idle ticks repeat; a tick that saw a request would be new)."""
    if isinstance(doc, dict):
        out = {k: normal(v) for k, v in doc.items() if k not in VOLATILE_KEYS}
        if isinstance(out.get("history"), list):
            out["history"] = sorted({orjson.dumps(h, option=orjson.OPT_SORT_KEYS)
                                     for h in out["history"]})
        return out
    if isinstance(doc, list):
        return [normal(v) for v in doc]
    return doc


def snapshot(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=10,
                      headers={"authorization": f"Bearer {TOKEN}"}) as c:
        for path in ENDPOINTS:
            r = c.get(path)
            if path == "/metrics":
                body: Any = [line for line in r.content.splitlines()
                             if not VOLATILE_METRICS.match(line)]
            else:
                body = normal(r.json())
            out[path] = (r.status_code, body)
    return out


# The monitor's tick in these tests: short, so waiting for one costs little.
TICK_S = 0.25


def settled(url: str) -> dict[str, Any]:
    """Two equal snapshots a monitor tick apart (startup's own work, such as drift
    calibration, has ended; reading the endpoints changes nothing)."""
    last = snapshot(url)
    for _ in range(80):
        time.sleep(TICK_S + 0.1)
        now = snapshot(url)
        if now == last:
            return now
        last = now
    raise AssertionError("the stats endpoints never settled")


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_warm_up_changes_no_stats_or_metrics(store: str, serve: Any, repo_path: Any,
                                             defs_path: Any, monkeypatch: Any,
                                             request: Any) -> None:
    import redline.serving.server as server_module

    async def off(*args: Any) -> int:
        return 0

    monkeypatch.setattr(server_module, "warm_request_path", off)  # warmed below, by hand
    redis_url = request.getfixturevalue("redis_server").url if store == "redis" else ""
    settings = make_settings(repo_path, defs_path, store=store, redis_url=redis_url,
                             prediction_cache_entries=100, feature_cache_entries=100)
    settings.server.admin_enabled = True
    settings.server.admin_token = TOKEN
    settings.monitoring.trace_sample_ratio = 1.0
    settings.monitoring.tick_s = TICK_S
    settings.runtime.warmup_batch_sizes = [1, 4]
    srv = serve(settings)
    ts = int(time.time() * 1000)
    with httpx.Client(base_url=srv.http, timeout=10) as c:
        events = b"\n".join(orjson.dumps({"card_id": "w1", "amount": a, "ts": ts - i})
                            for i, a in enumerate([10.0, 30.0]))
        assert c.post("/v1/events", content=events).status_code < 300
    server = srv.server
    pipeline = server.pipeline
    if store == "memory":
        states = [s for k, s in pipeline.store.data.items() if "{card:w1}" in k]
        assert states and all(s.out is None for s in states)  # written, never read
    # The monitor's first drift evaluation of a version (every few ticks, once its background
    # calibration is done) adds its gauges by itself: wait for every version's, so none falls
    # between the two snapshots.
    monitor = server.monitor

    def every_version_reported() -> bool:
        judged = {key for key, drift in list(monitor.windows.drift.items())
                  if drift.has_reference or drift.prediction_ref is not None}
        return bool(judged) and judged <= set(monitor.drift_reports)

    deadline = time.monotonic() + 60
    while not every_version_reported():
        assert time.monotonic() < deadline, f"no drift evaluation: {monitor.drift_reports}"
        time.sleep(0.1)
    before = settled(srv.http)
    routed: list[str] = []  # a rollout's router: its draws belong to real requests
    server.registry.route_by(lambda name, key: routed.append(name))
    answered = srv.call(warm_request_path(server.registry, pipeline, settings,
                                          bool(server.observers), RedlineHttpProtocol))
    assert routed == [] and server.registry.route_by(None) is not None
    assert answered == 2  # cards (V2 and /v1) and cards_small (V2) answered the private app
    time.sleep(TICK_S + 0.2)  # a tick: anything the warm-up handed the monitor would show now
    after = snapshot(srv.http)
    for path in ENDPOINTS:
        assert after[path] == before[path], f"{path}: {after[path]} != {before[path]}"
    if store == "memory":
        assert all(s.out is not None for s in states)  # merged before the first request
    # and a real request is still seen by everything, as the first one
    with httpx.Client(base_url=srv.http, timeout=10) as c:
        r = c.post("/v1/models/cards/predict",
                   json={"entities": {"card_id": "w1"}, "request": {"amount": 5.0},
                         "session_id": "s1"})
        assert r.status_code == 200, r.text
        assert r.json()["session"]["counters"]["requests"] == 1.0  # no warm-up session
        stats = c.get("/v1/pipeline/stats").json()
        assert stats["paths"]["primary"] == 1
        assert stats["prediction_cache"]["entries"] == 1 or stats["prediction_cache"]


def test_present_ids_reads_the_memory_store_keys(serve: Any, repo_path: Any,
                                                 defs_path: Any) -> None:
    srv = serve(make_settings(repo_path, defs_path))
    ts = int(time.time() * 1000)
    with httpx.Client(base_url=srv.http, timeout=10) as c:
        body = b"\n".join(orjson.dumps({"card_id": cid, "amount": 1.0, "ts": ts})
                          for cid in ("a1", "a2", "a3"))
        assert c.post("/v1/events", content=body).status_code < 300
    pipeline = srv.server.pipeline
    route = pipeline.route(srv.server.registry.get("cards"))
    assert _present_ids(pipeline.store, route, None) == {"card": ["a1", "a2", "a3"]}
    assert _present_ids(pipeline.store, route, 1) == {"card": ["a1"]}


# A `redline serve` process with the warm-up "on" or "off" (argv[1]), as the benchmark starts it.
from benchmarks.first_request.first_request import SERVE  # noqa: E402


def start_serving(config: Any, warmup: str) -> tuple[Any, str]:
    """A fresh ``redline serve`` process with the warm-up "on" or "off", and its URL (its
    output goes to ``serve-<port>.log`` beside the config)."""
    import subprocess
    import sys

    from tests.conftest import free_port
    from tests.logwatch import log_to

    port = free_port()
    with log_to(Path(config).parent / f"serve-{port}.log") as out:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, warmup, "serve", "--config",
                                 str(config), "--http-port", str(port), "--no-grpc"],
                                stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: Any, url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, \
            f"no server: {proc.poll()=}; its log: {log.read_text()[-2000:]}"
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)


def first_over_later(url: str, gap_s: float, requests: int) -> float:
    """The first ``/v1`` request's server time over the median of the next ones, each request
    sent ``gap_s`` after the previous answer (the first ``gap_s`` after the call), so all of
    them meet the same conditions."""
    import statistics

    with httpx.Client(base_url=url, timeout=10) as c:
        body = {"entities": {"card_id": "p7"}, "request": {"amount": 12.5}}
        totals = []
        for _ in range(requests):
            time.sleep(gap_s)
            r = c.post("/v1/models/cards/predict", json=body)
            assert r.status_code == 200, r.text
            totals.append(r.json()["timings_us"]["total"])
    return totals[0] / statistics.median(totals[1:])


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_warm_up_makes_the_first_request_cheaper(store: str, tmp_path: Any,
                                                            repo_path: Any, defs_path: Any,
                                                            request: Any) -> None:
    """Fresh servers with the warm-up and without it, interleaved (five of each, one process
    each, preloaded store, monitoring on): the median first-request ratio is lower with it.
    Interleaved so the machine's moods fall on both sides alike; an absolute bound (first <= 2x
    later) held in some runs and not in others on this shared 2-core machine (a first request
    after a quiet spell is slow in every stage, benchmarks/first_request/), so the
    figure lives in the benchmark and the test asserts the effect. Measured in this test:
    with 1.4-1.8, without 2.1-3.6. Pairs that could not change the verdict are not run: the
    first three usually decide the median of five."""
    import math
    import statistics

    where = f"  store: {store}\n"
    if store == "redis":
        where += f"  redis_url: {request.getfixturevalue('redis_server').url}\n"

    ts = int(time.time() * 1000)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(
        orjson.dumps({"card_id": f"p{i % 50}", "amount": 1.0 + i % 7, "ts": ts - i * 1000})
        for i in range(2000)))
    config = tmp_path / "redline.yaml"
    config.write_text(f"repository: {repo_path}\nfeatures:\n  definitions: {defs_path}\n"
                      f"{where}  preload: {events}\n"
                      "server:\n  watch_repository: false\n")
    on: list[float] = []
    off: list[float] = []

    def decided(judged_at: int) -> bool:
        """Whether the median over ``judged_at`` pairs is already lower with the warm-up,
        whatever the pairs not yet run measure (each "on" as slow, each "off" as fast as can
        be): then they cannot change the verdict, and are not run."""
        rest = judged_at - len(on)
        return (statistics.median(on + [math.inf] * rest)
                < statistics.median(off + [-math.inf] * rest))

    def pairs(n: int, judged_at: int) -> None:
        for _ in range(n):
            if decided(judged_at):
                return
            for warmup, ratios in (("on", on), ("off", off)):
                proc, url = start_serving(config, warmup)
                try:
                    wait_ready(proc, url, config.parent / f"serve-{url.rsplit(':', 1)[1]}.log")
                    ratios.append(first_over_later(url, 0.01, 30))
                finally:
                    proc.terminate()
                    proc.wait(30)

    pairs(5, 5)  # measured ranges (above) do not overlap: five of each is usually plenty
    if statistics.median(on) >= statistics.median(off):
        # A busy spell (the suite's other worker) can swamp five pairs: judge ten of each.
        pairs(5, 10)
    # (A run stopped early by ``decided`` has its medians on the same side as the full run's:
    # the values it left out could only have moved them further apart.)
    assert statistics.median(on) < statistics.median(off), (on, off)


def _warm_by_hand(srv: Any, caplog: Any) -> int:
    server = srv.server
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="redline"):
        return int(srv.call(warm_request_path(server.registry, server.pipeline, srv.settings,
                                              bool(server.observers), RedlineHttpProtocol)))


def test_warm_up_answers_every_request_of_a_monitored_server(serve: Any, repo_path: Any,
                                                             defs_path: Any,
                                                             caplog: Any) -> None:
    """With monitoring on (the default), every warm-up request, ``/v1`` ones sampled for the
    drift windows included, answers 200: no error line, no traceback, both models warm."""
    settings = make_settings(repo_path, defs_path)
    settings.runtime.warmup_batch_sizes = [1, 4]
    assert settings.monitoring.enabled
    srv = serve(settings)
    assert _warm_by_hand(srv, caplog) == 2
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert problems == [], [r.getMessage() for r in problems]
    warm = [r.getMessage() for r in caplog.records if "request path warm" in r.getMessage()]
    assert len(warm) == 1 and " to 2 models" in warm[0]


@pytest.mark.allow_log(r"warm-up of model cards: .* answered 400")
def test_a_failed_warm_up_request_is_one_error_line_naming_its_model(
        serve: Any, repo_path: Any, defs_path: Any, caplog: Any) -> None:
    """Warm-up batches of 4 rows where ``pipeline.max_instances`` is 2: ``cards``' 4-row
    ``/v1`` requests answer 400. That is one error line naming the model, the path and the
    answer's message; the model is not counted warm, and the ``request path warm`` line counts
    the answered requests only."""
    settings = make_settings(repo_path, defs_path)
    settings.pipeline.max_instances = 2
    settings.runtime.warmup_batch_sizes = [1, 4]
    srv = serve(settings)
    assert _warm_by_hand(srv, caplog) == 1  # cards_small (V2 only) is warm; cards is not
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert "model cards:" in errors[0] and "/v1/models/cards/predict answered 400" in errors[0]
    assert "max_instances" in errors[0] or "instances" in errors[0]
    assert not any(r.exc_info for r in caplog.records)
    warm = [r.getMessage() for r in caplog.records if "request path warm" in r.getMessage()]
    # two models x three V2 bodies (JSON, JSON naming outputs, binary) x ten rounds, and the
    # ten one-row /v1 bodies; the ten 4-row ones were refused
    assert "warm: 70 requests to 1 models" in warm[0], warm
