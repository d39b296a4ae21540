"""What monitoring adds to one V2 request in one process, and how much of it precedes the answer.

Two servers' REST apps (monitoring off and on, the fraud model of the overhead benchmark) are
built in this process, not served: ``RestApp.infer_inline`` is called directly, as the HTTP
protocol calls it, in rounds that alternate the two. Reported: ns a call (median of rounds and
best round) and ns until ``respond`` is called (the part a client waits for; the feed and
every 16th call's fold come after it). No sockets, no other process: a tight-loop figure,
which the end-to-end benchmark (``overhead.py``) finds several times larger among real I/O.

    PYTHONPATH=src:. .venv/bin/python benchmarks/observability/inline_cost.py --rounds 21
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


def _server(monitoring: bool, root: Path) -> Any:
    from redline.config import Settings
    from redline.serving.server import RedlineServer

    settings = Settings()
    settings.server.watch_repository = False
    settings.server.grpc_enabled = False
    settings.monitoring.enabled = monitoring
    settings.runtime.warmup_batch_sizes = [1]
    return RedlineServer(settings, make_repository(root))


async def measure(rounds: int, calls: int) -> dict[str, dict[str, float]]:
    scratch = Path(tempfile.mkdtemp(prefix="redline-inline-"))
    servers = {"off": _server(False, scratch / "off"), "on": _server(True, scratch / "on")}
    for server in servers.values():
        await server.registry.sync()
    rows = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    bodies = [orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3],
                                        "data": r.tolist()}]}) for r in rows]
    answered: list[int] = []
    at: list[int] = [0]

    def respond(status: int, body: bytes, headers: Any) -> None:
        at[0] = time.perf_counter_ns()
        answered.append(status)

    gc.collect()
    gc.freeze()
    total: dict[str, list[float]] = {name: [] for name in servers}
    before: dict[str, list[float]] = {name: [] for name in servers}
    for r in range(rounds):
        for name in (("off", "on") if r % 2 else ("on", "off")):
            app = servers[name].app
            waited = 0
            t0 = time.perf_counter_ns()
            for i in range(calls):
                t = time.perf_counter_ns()
                app.infer_inline(PATH, HEADERS, bodies[i & 63], respond)
                waited += at[0] - t
            total[name].append((time.perf_counter_ns() - t0) / calls)
            before[name].append(waited / calls)
            await asyncio.sleep(0)  # the monitor's tick is not running: nothing else to do
    assert set(answered) == {200}, set(answered)
    out: dict[str, dict[str, float]] = {}
    for label, series in (("call", total), ("until_respond", before)):
        for name, values in series.items():
            out[f"{name}_{label}_ns"] = {"median": round(statistics.median(values)),
                                        "best": round(min(values))}
        out[f"added_{label}_ns"] = {
            "median": round(statistics.median(series["on"]) - statistics.median(series["off"])),
            "best": round(min(series["on"]) - min(series["off"]))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=4000, help="calls a round and server")
    args = ap.parse_args()
    result = asyncio.run(measure(args.rounds, args.calls))
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
