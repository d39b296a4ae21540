"""Out-of-core training set: a fraud-like stream larger than memory, built by the disk engine.

    .venv/bin/python -m benchmarks.features.out_of_core [--events 100000000] [--labels 10000000]
        [--entities 1000000] [--budget 3GB] [--dir DIR] [--keep]

Generates a card-transaction stream (card ids with a skewed popularity, amounts, merchants, a few
late arrivals) and label rows to Parquet in chunks (vectorised numpy/pyarrow), then runs
``redline features training-set --engine disk`` on it in a child process and reports its wall
time and the peak memory of the whole process tree (the CLI and its workers), sampled from /proc
every 0.2 s: the sum of proportional set sizes (PSS: a page shared by the forked workers counts
once in all), and the plain sum of resident sizes (which counts shared pages once per process).
Five views over one source: count/sum over 1 h, count/mean/max over 1 day, mean/stddev over
7 days, last over 1 day and distinct merchants over 1 day.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DEFS = '''
from redline.features import (Entity, EventSource, FeatureView, agg_max, agg_sum, count,
                              distinct, last, mean, stddev)

card = Entity("card", "card_id")
tx = EventSource("tx", card, {"amount": float, "merchant": int}, allowed_lateness="5m")
card_1h = FeatureView("card_1h", tx, [count("1h"), agg_sum("amount", "1h")])
card_1d = FeatureView("card_1d", tx, [count("1d"), mean("amount", "1d"), agg_max("amount", "1d")])
card_7d = FeatureView("card_7d", tx, [mean("amount", "7d"), stddev("amount", "7d")])
card_last = FeatureView("card_last", tx, [last("amount", "1d")])
card_merchants = FeatureView("card_merchants", tx, [distinct("merchant", "1d")])
'''
T0 = 1_767_225_600_000
DAYS = 30
CHUNK = 5_000_000


def generate(folder: Path, events: int, labels: int, entities: int, seed: int = 0) -> None:
    """``events.parquet`` (card_id, amount, merchant, ts, _arrival_ms) in time order and
    ``labels.parquet`` (card_id, ts, is_fraud), written chunk by chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    span = DAYS * 86_400_000
    with pq.ParquetWriter(folder / "events.parquet", pa.schema([
            ("card_id", pa.int64()), ("amount", pa.float64()), ("merchant", pa.int64()),
            ("ts", pa.int64()), ("_arrival_ms", pa.int64())])) as w:
        for start in range(0, events, CHUNK):
            n = min(CHUNK, events - start)
            ts = T0 + (np.arange(start, start + n, dtype=np.int64) * span) // events
            card = (rng.pareto(1.2, n) * entities / 20).astype(np.int64) % entities
            late = rng.random(n) < 0.02
            arrival = ts + np.where(late, rng.integers(0, 600_000, n), rng.integers(0, 500, n))
            w.write_table(pa.table({
                "card_id": card, "amount": np.round(rng.lognormal(3.5, 1.2, n), 2),
                "merchant": rng.integers(0, 50_000, n), "ts": ts, "_arrival_ms": arrival}))
    with pq.ParquetWriter(folder / "labels.parquet", pa.schema([
            ("card_id", pa.int64()), ("ts", pa.int64()), ("is_fraud", pa.int8())])) as w:
        for start in range(0, labels, CHUNK):
            n = min(CHUNK, labels - start)
            w.write_table(pa.table({
                "card_id": rng.integers(0, entities, n),
                "ts": T0 + rng.integers(0, span, n),
                "is_fraud": (rng.random(n) < 0.01).astype(np.int8)}))


def tree_memory(pid: int) -> tuple[int, int]:
    """(PSS, RSS) bytes of ``pid`` and all its descendants, summed."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            kids.setdefault(int(parts[1]), []).append(int(d))
        except (OSError, IndexError, ValueError):
            continue
    pss = rss = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        todo += kids.get(p, [])
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return pss, rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000_000)
    ap.add_argument("--labels", type=int, default=10_000_000)
    ap.add_argument("--entities", type=int, default=1_000_000)
    ap.add_argument("--budget", default="3GB")
    ap.add_argument("--dir", default=None, help="Where to write the inputs (default: a temp dir).")
    ap.add_argument("--keep", action="store_true", help="Reuse inputs already in --dir.")
    args = ap.parse_args()
    folder = Path(args.dir or tempfile.mkdtemp(prefix="redline-ooc-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "defs.py").write_text(DEFS)
    t0 = time.perf_counter()
    if not (args.keep and (folder / "events.parquet").exists()):
        generate(folder, args.events, args.labels, args.entities)
    gen_s = time.perf_counter() - t0
    print(f"generated {args.events:,} events, {args.labels:,} labels in {gen_s:.1f}s "
          f"({(folder / 'events.parquet').stat().st_size / 1e9:.2f} GB Parquet)", flush=True)
    cmd = [sys.executable, "-m", "redline.cli", "features", "training-set", "-d",
           str(folder / "defs.py"), "--events", str(folder / "events.parquet"), "--labels",
           str(folder / "labels.parquet"), "--out", str(folder / "train.parquet"), "--engine",
           "disk", "--memory-budget", args.budget]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    peak_pss = peak_rss = 0
    while proc.poll() is None:
        pss, rss = tree_memory(proc.pid)
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"build failed with exit code {proc.returncode}")
    print(f"disk engine: {wall:.1f}s wall, peak memory of the process tree: PSS "
          f"{peak_pss / 2**30:.2f} GiB (RSS summed {peak_rss / 2**30:.2f} GiB), "
          f"{os.cpu_count()} cores, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
