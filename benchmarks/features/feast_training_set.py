"""Point-in-time training sets: Feast's ``get_historical_features`` (file offline store) against
redline's builder, from the same Parquet files, in the same run.

The data is the Feast peer's (``benchmarks/peers/feast/``): N cards, 5 feature views of 8 float32
features, one row per card per view with an event time in the last 2 hours, TTL 1 day. redline
defines the same thing as ``last(field, "1d")`` per feature (every event lies well inside one day
of every label time, so the tiles' edges never matter). Label rows are random cards at random times
over the same 2 hours, so many rows come before a card's value exists: Feast drops such rows,
redline returns them with missing values. Values are compared on the rows both return (float32
equality, NaN = NaN), and each side's returned row count is reported.

What each clock covers — the same work on both sides. Each side reads the label rows (the entity
frame) from their Parquet file once, outside its clock: both APIs take them as a pandas frame.
Each timed build then starts from the 5 feature Parquet files on disk and ends with a pandas
frame of every label row's features in memory: for Feast, ``get_historical_features(entity_df,
refs).to_df()`` (which reads the files itself); for redline, reading the 5 files (a frame per
feature view's source, as the files come), the label times as epoch ms, and
``build_training_set``. Nothing else is timed: not the imports, not ``store.apply`` (Feast's
registry), not redline's definitions, not writing the result.

Feast runs in its own virtual environment (never a redline dependency), in a child process that
stays up for the whole run; redline runs in this process. Each side first builds ``--warmup``
times untimed (a process's first builds pay for lazy imports and for touching new memory). Then
come ``--repeat`` rounds; in each, the sides take turns, and each makes ``--settle`` untimed
builds right before its timed one, so a busy spell on this shared machine falls on both sides and
each timed build meets memory its own side has touched. That matters on a VM: memory another
process has just freed costs close to a second of system time per build to touch again (measured
here: redline's 1M-row build right after Feast's, 0.7 s wall with 0.9 s of system time over its
threads, the kernel zeroing pages; right after its own, 0.2 s), and without the settling build
every redline build would follow a Feast build. Each side reports its best and its median timed
build and the process CPU time (all threads) of its best; the speed-up is best over best, with
median over median alongside (``make bench`` judges the target on the medians); the untimed
settling builds are listed too.

The Feast side runs in the ``feast`` peer's environment (``benchmarks/peers/``: made on first use,
or ahead with ``bash benchmarks/peers/setup.sh feast``); ``--feast-python`` names another one
(any with ``pip install feast pandas pyarrow`` serves).

    python -m benchmarks.features.feast_training_set [--feast-python PY] [--cards 100000] \\
        [--labels 100000,1000000] [--warmup 1] [--settle 1] [--repeat 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

N_VIEWS, N_FEAT = 5, 8
# The Feast side: set up once, then one timed build per "build" line on stdin, a JSON line back.
FEAST_SIDE = textwrap.dedent('''
    import json, sys, time
    from datetime import timedelta
    import pandas as pd
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Float32
    repo, labels_path, out_path, n_views, n_feat = sys.argv[1:6]
    n_views, n_feat = int(n_views), int(n_feat)
    store = FeatureStore(repo_path=repo)
    card = Entity(name="card", join_keys=["card"], value_type=ValueType.INT64)
    views = []
    for v in range(n_views):
        src = FileSource(name=f"fv{v}_src", path=f"{repo}/data/fv{v}.parquet",
                         timestamp_field="event_timestamp")
        views.append(FeatureView(name=f"fv{v}", entities=[card], ttl=timedelta(days=1),
                                 schema=[Field(name=f"fv{v}_f{j}", dtype=Float32)
                                         for j in range(n_feat)], source=src))
    store.apply([card, *views])
    refs = [f"fv{v}:fv{v}_f{j}" for v in range(n_views) for j in range(n_feat)]
    labels = pd.read_parquet(labels_path)  # the entity frame: read once, outside the clock
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        entity_df = labels.copy()  # untimed: each build gets the frame as read
        t0, c0 = time.perf_counter(), time.process_time()
        df = store.get_historical_features(entity_df=entity_df, features=refs).to_df()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if line.strip() == "last":
            df.to_parquet(out_path, index=False)
        print(json.dumps({"seconds": wall, "cpu_s": cpu, "rows": len(df)}), flush=True)
        del df
''')


def write_data(repo: Path, cards: int, seed: int = 0) -> pd.Timestamp:
    """The Feast peer's feature tables (the generator of its ``prepare.py``) and a Feast repo."""
    (repo / "data").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    now = pd.Timestamp.now(tz="UTC").floor("s")
    for v in range(N_VIEWS):
        df = pd.DataFrame({"card": np.arange(cards, dtype=np.int64)})
        for j in range(N_FEAT):
            df[f"fv{v}_f{j}"] = rng.standard_normal(cards).astype(np.float32)
        df["event_timestamp"] = now - pd.to_timedelta(rng.integers(60, 7200, cards), unit="s")
        df.to_parquet(repo / "data" / f"fv{v}.parquet", index=False)
    (repo / "feature_store.yaml").write_text(
        "project: bench\nprovider: local\nregistry: data/registry.db\n"
        "online_store: {type: sqlite, path: data/online.db}\noffline_store: {type: file}\n"
        "entity_key_serialization_version: 3\n")
    return now


def write_labels(path: Path, n: int, cards: int, now: pd.Timestamp, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ts = now - pd.to_timedelta(rng.integers(0, 7200_000, n), unit="ms")
    pd.DataFrame({"card": rng.integers(0, cards, n).astype(np.int64), "event_timestamp": ts,
                  "row": np.arange(n, dtype=np.int64)}).to_parquet(path, index=False)


def definitions():  # type: ignore[no-untyped-def]
    from redline.features import Entity, EventSource, FeatureDefinitions, FeatureView, last

    card = Entity("card", join_key="card")
    views = []
    for v in range(N_VIEWS):
        src = EventSource(f"fv{v}_src", card, {f"fv{v}_f{j}": float for j in range(N_FEAT)},
                          timestamp="event_timestamp")
        views.append(FeatureView(f"fv{v}", src, [last(f"fv{v}_f{j}", "1d",
                                                      name=f"fv{v}_f{j}")
                                                 for j in range(N_FEAT)]))
    return FeatureDefinitions.of(views)


def redline_side(repo: Path, labels: pd.DataFrame) -> tuple[float, float, pd.DataFrame]:
    """(wall s, CPU s, table) of one build from the feature files and the label frame."""
    # the whole builder (offline imports the kernel, the kernel the rest of training/) is
    # imported before the clock starts, as Feast's
    from redline.features.offline import build_training_set

    defs = definitions()
    t0, c0 = time.perf_counter(), time.process_time()
    events = {f"fv{v}_src": pd.read_parquet(repo / "data" / f"fv{v}.parquet")
              for v in range(N_VIEWS)}  # a frame per source, as the files come
    rows = labels.drop(columns=["event_timestamp"])
    rows["ts"] = labels["event_timestamp"].astype("datetime64[ms, UTC]").astype("int64")
    table = build_training_set(defs, events, rows)
    return time.perf_counter() - t0, time.process_time() - c0, table


class FeastChild:
    """The Feast side in its own environment: set up once, then one timed build per call."""

    def __init__(self, python: str, repo: Path, labels: Path, out: Path) -> None:
        self.err = tempfile.TemporaryFile(mode="w+")  # a file: a full pipe would stall it
        self.proc = subprocess.Popen(
            [python, "-c", FEAST_SIDE, str(repo), str(labels), str(out), str(N_VIEWS),
             str(N_FEAT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
            text=True, cwd=repo)
        self._reply()

    def _reply(self) -> dict[str, Any]:
        out: IO[str] = self.proc.stdout  # type: ignore[assignment]
        for line in out:
            if line.startswith("{"):
                return json.loads(line)  # type: ignore[no-any-return]
        self.proc.wait(timeout=60)
        self.err.seek(0)
        sys.exit(f"Feast failed:\n{self.err.read()[-3000:]}")

    def build(self, last: bool = False) -> dict[str, Any]:
        stdin: IO[str] = self.proc.stdin  # type: ignore[assignment]
        stdin.write("last\n" if last else "build\n")
        stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.err.close()


def interleaved(feast: FeastChild, repo: Path, labels_path: Path, warmup: int, settle: int,
                repeat: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """``warmup`` untimed builds per side, then ``repeat`` rounds; in each, each side in turn
    makes ``settle`` untimed builds and then its timed one."""
    labels = pd.read_parquet(labels_path)  # the label frame: read once, outside the clock
    for _ in range(warmup):
        feast.build()
        redline_side(repo, labels)
    f_runs: list[dict[str, Any]] = []
    r_runs: list[tuple[float, float]] = []
    f_settle: list[float] = []
    r_settle: list[float] = []
    table = pd.DataFrame()
    for i in range(repeat):
        f_settle += [feast.build()["seconds"] for _ in range(settle)]
        f_runs.append(feast.build(last=i == repeat - 1))
        r_settle += [redline_side(repo, labels)[0] for _ in range(settle)]
        wall, cpu, table = redline_side(repo, labels)
        r_runs.append((wall, cpu))
    f_wall = [r["seconds"] for r in f_runs]
    r_wall = [w for w, _ in r_runs]
    f_best, r_best = min(f_runs, key=lambda r: r["seconds"]), min(r_runs)
    f_med, r_med = statistics.median(f_wall), statistics.median(r_wall)
    return {"feast_s": round(f_best["seconds"], 3), "redline_s": round(r_best[0], 3),
            "speedup": round(f_best["seconds"] / r_best[0], 3),
            "feast_median_s": round(f_med, 3), "redline_median_s": round(r_med, 3),
            "speedup_median": round(f_med / r_med, 3),
            "feast_cpu_s": round(f_best["cpu_s"], 3), "redline_cpu_s": round(r_best[1], 3),
            "feast_runs_s": [round(x, 3) for x in f_wall],
            "redline_runs_s": [round(x, 3) for x in r_wall],
            "feast_settle_s": [round(x, 3) for x in f_settle],
            "redline_settle_s": [round(x, 3) for x in r_settle]}, table


def compare(feast: pd.DataFrame, red: pd.DataFrame) -> dict[str, int]:
    """Values on the rows both return; row counts of each."""
    both = feast.merge(red, on="row", suffixes=("", "_redline"))
    diff = 0
    for v in range(N_VIEWS):
        for j in range(N_FEAT):
            a = both[f"fv{v}_f{j}"].to_numpy(dtype=np.float32)
            b = both[f"fv{v}:fv{v}_f{j}"].to_numpy(dtype=np.float64).astype(np.float32)
            diff += int((~((a == b) | (np.isnan(a) & np.isnan(b)))).sum())
    complete = red[[f"fv{v}:fv{v}_f{j}" for v in range(N_VIEWS) for j in range(N_FEAT)]]
    return {"feast_rows": len(feast), "redline_rows": len(red),
            "redline_rows_with_every_value": int(complete.notna().all(axis=1).sum()),
            "compared_rows": len(both), "compared_values": len(both) * N_VIEWS * N_FEAT,
            "differences": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--feast-python", default=None,
                    help="the Feast peer's interpreter (default: the feast peer of "
                    "benchmarks/peers/, made when missing)")
    ap.add_argument("--cards", type=int, default=100_000)
    ap.add_argument("--labels", default="100000,1000000")
    ap.add_argument("--warmup", type=int, default=1, help="untimed builds per side first")
    ap.add_argument("--settle", type=int, default=1,
                    help="untimed builds per side right before each timed one")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds: the sides take turns, one timed build each; the best counts")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.feast_python is None:
        from benchmarks.peers import envs

        args.feast_python = str(envs.ensure("feast"))
    check = subprocess.run([args.feast_python, "-c", "import feast"], capture_output=True)
    if check.returncode:
        sys.exit(f"{args.feast_python} cannot import feast: leave --feast-python out (the feast "
                 "peer of benchmarks/peers/ is made for you), or make one with `python3 -m venv "
                 "DIR && DIR/bin/pip install feast pandas pyarrow` and pass DIR/bin/python")
    results = []
    with tempfile.TemporaryDirectory(prefix="feast-ts-") as tmp:
        repo = Path(tmp) / "repo"
        now = write_data(repo, args.cards)
        for i, n in enumerate(int(x) for x in args.labels.split(",")):
            labels = Path(tmp) / f"labels_{n}.parquet"
            write_labels(labels, n, args.cards, now, seed=1 + i)
            out = Path(tmp) / f"feast_{n}.parquet"
            feast = FeastChild(args.feast_python, repo, labels, out)
            try:
                timing, table = interleaved(feast, repo, labels, args.warmup, args.settle,
                                            args.repeat)
            finally:
                feast.close()
            row = {"labels": n, "cards": args.cards, **timing,
                   **compare(pd.read_parquet(out), table)}
            print(json.dumps(row), flush=True)
            results.append(row)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
