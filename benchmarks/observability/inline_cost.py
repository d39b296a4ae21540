"""What monitoring adds to one V2 or /v1 request in one process, and how much precedes the answer.

Two servers' REST apps (monitoring off and on, the fraud model of the overhead benchmark) are
built in this process, not served: ``RestApp.infer_inline`` is called directly, as the HTTP
protocol calls it (``--api v1``: the ``/v1`` predict route's handler, awaited), in rounds that
alternate the two. Reported: ns a call (median of rounds and best round) and, for V2, ns until
``respond`` is called (the part a client waits for; the feed and every 16th call's fold come
after it). ``--drain``: each round of the monitored server ends with the fold the tick would do
(``ServerMonitor.drain``), inside the round's time, so work moved from the request to the tick
is still counted; ``--tick``: each round ends with the monitor's whole tick instead (fold,
metrics, drift/quality windows), a round standing for a second of traffic. The process CPU time
a call (``cpu``) and its on/off ratio per round are reported too. The windows' sample is paced
in time and this loop is far faster than a served request: ``--emulate-rate R`` samples the
share of requests a server at ``R`` req/s would. ``--demo`` builds both servers from the demo
(``make demo`` first): ``/v1`` is then the fraud model with its features read from the
preloaded store, V2 the breast-cancer model, as ``capacity.py`` serves them. ``--api graph``:
V2 requests to ``benchmarks/models/python_compare.py``'s three-step graph (a Python featurizer,
an ONNX MLP, a Python post-step; a request the graph cannot answer on the spot is finished
queued). No sockets, no other process: a tight-loop figure; ``capacity.py`` measures a served
process at capacity.

    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/inline_cost.py --rounds 21
    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/inline_cost.py --api v1 --drain
    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/inline_cost.py --tick \
        --calls 2000 --emulate-rate 1150
    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/inline_cost.py --demo --api v1 \
        --tick --calls 1000 --emulate-rate 1150
    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/inline_cost.py --api graph --drain
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.monitoring.served import make_repository  # noqa: E402

PATH = "/v2/models/fraud/infer"
HEADERS = [(b"host", b"x"), (b"content-type", b"application/json")]


def _server(monitoring: bool, root: Path, window_rows_per_s: float | None = None,
            repository: Any = None) -> Any:
    from redline.assembly import build_server
    from redline.config import Settings

    settings = Settings()
    settings.server.watch_repository = False
    settings.server.grpc_enabled = False
    settings.monitoring.enabled = monitoring
    if window_rows_per_s is not None:
        settings.monitoring.window_rows_per_s = window_rows_per_s
    settings.runtime.warmup_batch_sizes = [1]
    return build_server(settings, repository if repository is not None
                        else make_repository(root))


GRAPH_PATH = "/v2/models/graph/infer"


def _graph_repository(root: Path) -> Any:
    """The three-step graph of ``benchmarks/models/python_compare.py`` (a Python featurizer,
    an MLP in ONNX, a Python post-step), added as that benchmark adds it."""
    import subprocess

    from benchmarks.models.peer_apps import workload
    from benchmarks.models.python_compare import _REDLINE_REPO
    from redline.models import ModelRepository

    files = root / "graph-files"
    workload.write_files(files)
    subprocess.run([sys.executable, "-c", _REDLINE_REPO, str(root / "repo"), str(files),
                    "graph"], check=True, cwd=ROOT)
    return ModelRepository(root / "repo")


def _graph_bodies() -> list[bytes]:
    from benchmarks.models.peer_apps import workload

    rows = np.random.default_rng(0).random((64, workload.WIDTH), dtype=np.float32)
    return [orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                      "shape": [1, workload.WIDTH], "data": r.tolist()}]})
            for r in rows]


DEMO = ROOT / ".redline" / "demo"


def _demo_server(monitoring: bool, window_rows_per_s: float | None = None) -> Any:
    """A server of the demo's configuration, its memory store preloaded (``redline serve``'s
    steps, without the ports)."""
    from redline.assembly import build_server, preload_store
    from redline.config import apply_serve_options, load_settings

    settings = load_settings(DEMO / "redline.yaml")
    apply_serve_options(settings, no_grpc=True, no_watch=True)
    settings.monitoring.enabled = monitoring
    if window_rows_per_s is not None:
        settings.monitoring.window_rows_per_s = window_rows_per_s
    server = build_server(settings)
    preload_store(server, settings.features.preload)
    return server


def _demo_requests() -> tuple[list[bytes], bytes]:
    """64 ``/v1`` bodies of the demo's fraud request, over the preloaded cards, and the
    breast-cancer V2 body."""
    sent = orjson.loads((DEMO / "fraud-request.json").read_bytes())
    cards = []
    with open(DEMO / "fraud-events.jsonl", "rb") as events:
        for line in events:
            card = orjson.loads(line).get("card_id")
            if card and card not in cards:
                cards.append(card)
            if len(cards) == 64:
                break
    bodies = [orjson.dumps({**sent, "entities": {**sent["entities"], "card_id": card}})
              for card in cards]
    return (bodies * 64)[:64], (DEMO / "infer.json").read_bytes()


V1_PATH = "/v1/models/fraud/predict"

def _handles(server: Any) -> list[Any]:
    """Every loaded version's handle of ``server``."""
    return [h for versions in server.registry._handles.values() for h in versions.values()]


def _v1_handler(app: Any) -> Any:
    """The ``/v1`` predict route's handler, as the router would call it."""
    return next(r.handler for r in app._routes
                if r.method == "POST" and r.template == "/v1/models/{name}/predict")


async def measure(rounds: int, calls: int, api: str = "v2",
                  drain: bool = False, tick: bool = False,
                  window_rows_per_s: float | None = None,
                  emulate_rate: float | None = None,
                  demo: bool = False) -> dict[str, dict[str, float]]:
    scratch = Path(tempfile.mkdtemp(prefix="redline-inline-"))
    if demo:
        servers = {"off": _demo_server(False), "on": _demo_server(True, window_rows_per_s)}
    elif api == "graph":
        servers = {name: _server(name == "on", scratch / name, window_rows_per_s,
                                 _graph_repository(scratch / name)) for name in ("off", "on")}
    else:
        servers = {"off": _server(False, scratch / "off"),
                   "on": _server(True, scratch / "on", window_rows_per_s)}
    for server in servers.values():
        await server.registry.sync()
    if servers["on"].monitor is not None:  # drift thresholds, as a settled server has them
        servers["on"].monitor.prepare_loaded(wait=True)
    rows = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    bodies = [orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3],
                                        "data": r.tolist()}]}) for r in rows]
    v1_requests = [orjson.dumps({"request": {"amount": float(r[0]), "age": float(r[1]),
                                             "channel": int(abs(r[2]) * 2) % 3}})
                   for r in rows]
    path = PATH
    if demo:
        v1_requests, v2_body = _demo_requests()
        bodies = [v2_body] * 64
        path = "/v2/models/breast_cancer/infer"
    elif api == "graph":
        bodies, path = _graph_bodies(), GRAPH_PATH
    from redline.serving.app import HttpRequest

    answered: list[int] = []
    at: list[int] = [0]

    def respond(status: int, body: bytes, headers: Any) -> None:
        at[0] = time.perf_counter_ns()
        answered.append(status)

    async def run(app: Any, calls: int) -> int:
        """``calls`` requests through ``app``; the ns until ``respond`` (V2), summed."""
        waited = 0
        if api == "v1":
            handler = _v1_handler(app)
            for i in range(calls):
                request = HttpRequest("POST", V1_PATH, {"name": "fraud"}, {},
                                      v1_requests[i & 63], time.perf_counter())
                answered.append((await handler(request)).status)
        else:
            for i in range(calls):
                t = time.perf_counter_ns()
                later = app.infer_inline(path, HEADERS, bodies[i & 63], respond)
                if later is not None:  # queued (a graph's step kept off the loop): finish it
                    await later({}, None, send)
                waited += at[0] - t
        return waited

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            respond(message["status"], b"", [])

    if emulate_rate:
        # The windows' sample is paced in time; this loop runs requests far faster than a
        # server at capacity gets them. Scale the pace so the share of requests sampled is
        # the one at ``emulate_rate`` req/s.
        from redline.config import MonitoringSettings

        rows_per_s = window_rows_per_s or MonitoringSettings().window_rows_per_s
        share = min(1.0, rows_per_s / emulate_rate)
        t0 = time.perf_counter()
        await run(servers["off"].app, 2000)
        loop_rate = 2000 / (time.perf_counter() - t0)  # calls a second, unmonitored
        for handle in _handles(servers["on"]):
            handle._io_gap_ns = int(1e9 / (share * loop_rate))
    gc.collect()
    gc.freeze()
    total: dict[str, list[float]] = {name: [] for name in servers}
    before: dict[str, list[float]] = {name: [] for name in servers}
    cpu: dict[str, list[float]] = {name: [] for name in servers}
    for r in range(rounds):
        for name in (("off", "on") if r % 2 else ("on", "off")):
            monitor = servers[name].monitor
            c0 = time.process_time_ns()
            t0 = time.perf_counter_ns()
            waited = await run(servers[name].app, calls)
            if tick and monitor is not None:
                await monitor.tick()  # a round is a second of traffic: its whole tick
            elif drain and monitor is not None:
                monitor.drain()
            total[name].append((time.perf_counter_ns() - t0) / calls)
            cpu[name].append((time.process_time_ns() - c0) / calls)
            before[name].append(waited / calls)
            await asyncio.sleep(0)  # the monitor's tick is not running: nothing else to do
    assert set(answered) == {200}, set(answered)
    out: dict[str, dict[str, float]] = {}
    labels = (("call", total), ("cpu", cpu), ("until_respond", before))
    for label, series in labels[:2 if api == "v1" else 3]:
        for name, values in series.items():
            out[f"{name}_{label}_ns"] = {"median": round(statistics.median(values)),
                                        "best": round(min(values))}
        out[f"added_{label}_ns"] = {
            "median": round(statistics.median(series["on"]) - statistics.median(series["off"])),
            "best": round(min(series["on"]) - min(series["off"]))}
    ratios = sorted(a / b for a, b in zip(cpu["on"], cpu["off"], strict=True))
    out["cpu_on_over_off"] = {"median": round(statistics.median(ratios), 4),
                              "q25": round(ratios[len(ratios) // 4], 4),
                              "q75": round(ratios[(3 * len(ratios)) // 4], 4)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=4000, help="calls a round and server")
    ap.add_argument("--api", choices=("v2", "v1", "graph"), default="v2",
                    help="graph: V2 requests to python_compare.py's three-step graph")
    ap.add_argument("--drain", action="store_true",
                    help="end each monitored round with the tick's fold, inside its time")
    ap.add_argument("--tick", action="store_true",
                    help="end each monitored round with the monitor's whole tick (fold, "
                         "metrics, drift/quality windows), inside its time: a round is a "
                         "second of traffic at --calls req/s")
    ap.add_argument("--window-rows-per-s", type=float, default=None,
                    help="monitoring.window_rows_per_s of the monitored server")
    ap.add_argument("--emulate-rate", type=float, default=None,
                    help="sample into the windows the share of requests a server at this many "
                         "req/s would (the loop runs far faster than that)")
    ap.add_argument("--demo", action="store_true",
                    help="the demo's servers (make demo): /v1 the fraud model with its features, "
                         "V2 the breast-cancer model")
    args = ap.parse_args()
    result = asyncio.run(measure(args.rounds, args.calls, args.api, args.drain, args.tick,
                                 args.window_rows_per_s, args.emulate_rate, args.demo))
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
