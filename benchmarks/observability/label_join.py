"""What the shared label join costs the monitoring tick, and a POST of labels, per backend.

None of it runs on a request's path: a request only appends its record; the tick writes the
predictions of the last second (``flush``) on its worker thread, and a label is joined in its
route. This measures, interleaved in one run, the tick's cost to write one second of
predictions with request ids (``--rows`` a second, the default ``window_rows_per_s``) and the
cost to join a POST of ``--rows`` labels, and the read of the windows a quality report is
computed from (5,000 pairs and recent scores once the windows are full), for the in-process
join (the floor), the SQLite file of a pool, and a redis-server on a free port (same machine):

    PYTHONPATH=src python benchmarks/observability/label_join.py --rows 1000 --rounds 20

It prints the median per round and per row, and each shared backend's ratio to the floor.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from redline.monitoring.joinstore import MemoryBackend, join_labels
from redline.monitoring.joinstore_redis import RedisBackend
from redline.monitoring.joinstore_sqlite import SqliteBackend


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="label-join-bench-"))
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port),
                              "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                             stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        backends: dict[str, Any] = {
            "memory": MemoryBackend(), "sqlite": SqliteBackend(str(workdir / "labels.sqlite")),
            "redis": RedisBackend(f"redis://127.0.0.1:{port}/0")}
        states = {k: b.state("m", "1", 100_000, 3600.0, 5000) for k, b in backends.items()}
        times: dict[str, dict[str, list[float]]] = {k: {"flush": [], "join": [], "read": []}
                                                    for k in backends}
        rng = np.random.default_rng(0)
        for r in range(args.rounds):
            ids = [f"r{r}-{i}" for i in range(args.rows)]
            scores = rng.random(args.rows)
            labels = (rng.random(args.rows) < scores).astype(float).tolist()
            for kind, backend in backends.items():  # interleaved: each round, every backend
                t0 = time.perf_counter()
                states[kind].predicted(ids, scores)
                backend.flush()
                t1 = time.perf_counter()
                joined, _, _ = join_labels([states[kind]], ids, labels)
                t2 = time.perf_counter()
                states[kind].snapshot()
                t3 = time.perf_counter()
                assert joined == args.rows
                times[kind]["flush"].append(t1 - t0)
                times[kind]["join"].append(t2 - t1)
                times[kind]["read"].append(t3 - t2)
        result: dict[str, Any] = {"rows": args.rows, "rounds": args.rounds}
        for kind in backends:
            row = {}
            for step in ("flush", "join", "read"):
                med = statistics.median(times[kind][step])
                floor = statistics.median(times["memory"][step])
                row[step] = {"ms": round(med * 1e3, 3), "us_per_row": round(med * 1e6 / args.rows,
                                                                           2),
                             "x_memory": round(med / floor, 1)}
            result[kind] = row
            print(f"{kind:7s} tick write {row['flush']['ms']:8.2f} ms "
                  f"({row['flush']['us_per_row']:6.2f} us/row, {row['flush']['x_memory']:6.1f}x)"
                  f"   join {row['join']['ms']:8.2f} ms ({row['join']['us_per_row']:6.2f} us/row,"
                  f" {row['join']['x_memory']:6.1f}x)   read of the windows "
                  f"{row['read']['ms']:6.2f} ms")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2))
    finally:
        redis.kill()
        redis.wait(5)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
