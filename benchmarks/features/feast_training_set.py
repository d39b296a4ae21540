"""Point-in-time training sets: Feast's ``get_historical_features`` (file offline store) against
redline's builder, from the same Parquet files, in the same run.

The data is the Feast peer kit's: N cards, 5 feature views of 8 float32 features, one row per card
per view with an event time in the last 2 hours, TTL 1 day. redline defines the same thing as
``last(field, "1d")`` per feature (every event lies well inside one day of every label time, so
the tiles' edges never matter). Label rows are random cards at random times over the same 2
hours, so many rows come before a card's value exists: Feast drops such rows, redline returns them
with missing values. Values are compared on the rows both return (float32 equality, NaN = NaN),
and each side's returned row count is reported.

Feast runs in its own virtual environment (never a redline dependency), in a child process that
times only ``get_historical_features(...).to_df()``; redline is timed from reading the Parquet
files (a frame per feature view's source, as the files come) to its finished table, with its
modules imported first as Feast's are. Each side runs ``--repeat`` times on the same inputs and
its best time counts (one run each with ``--repeat 1``).

Setting up the Feast side: the peer kit's ``setup.sh`` (``shared/peers/feast/``) makes a virtual
environment with Feast; any environment with ``pip install feast pandas pyarrow`` serves too.

    python -m benchmarks.features.feast_training_set --feast-python <kit venv>/bin/python \\
        [--cards 100000] [--labels 100000,1000000] [--repeat 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd

N_VIEWS, N_FEAT = 5, 8
FEAST_SIDE = textwrap.dedent('''
    import json, sys, time
    from datetime import timedelta
    import pandas as pd
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Float32
    repo, labels_path, out_path, n_views, n_feat, repeat = sys.argv[1:7]
    n_views, n_feat, repeat = int(n_views), int(n_feat), int(repeat)
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
    entity_df = pd.read_parquet(labels_path)
    seconds = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        df = store.get_historical_features(entity_df=entity_df, features=refs).to_df()
        seconds = min(seconds, time.perf_counter() - t0)
    df.to_parquet(out_path, index=False)
    print(json.dumps({"seconds": seconds, "rows": len(df)}))
''')


def write_data(repo: Path, cards: int, seed: int = 0) -> pd.Timestamp:
    """The kit's feature tables (``make_repo.py``'s generator) and a Feast repo using them."""
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


def redline_side(repo: Path, labels_path: Path) -> tuple[float, pd.DataFrame]:
    import redline.features.asof
    import redline.features.kernel  # noqa: F401 - imported before the clock starts, as Feast's
    from redline.features.offline import build_training_set

    defs = definitions()
    t0 = time.perf_counter()
    events = {f"fv{v}_src": pd.read_parquet(repo / "data" / f"fv{v}.parquet")
              for v in range(N_VIEWS)}  # a frame per source, as the files come
    labels = pd.read_parquet(labels_path)
    labels["ts"] = labels["event_timestamp"].astype("datetime64[ms, UTC]").astype("int64")
    table = build_training_set(defs, events, labels.drop(columns=["event_timestamp"]))
    return time.perf_counter() - t0, table


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
    ap.add_argument("--feast-python", required=True, help="python of the Feast kit's venv")
    ap.add_argument("--cards", type=int, default=100_000)
    ap.add_argument("--labels", default="100000,1000000")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side; the best counts")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    check = subprocess.run([args.feast_python, "-c", "import feast"], capture_output=True)
    if check.returncode:
        sys.exit(f"{args.feast_python} cannot import feast: set up the peer kit's environment "
                 "(shared/peers/feast/setup.sh), or make one with `python3 -m venv DIR && "
                 "DIR/bin/pip install feast pandas pyarrow`, and pass DIR/bin/python")
    results = []
    with tempfile.TemporaryDirectory(prefix="feast-ts-") as tmp:
        repo = Path(tmp) / "repo"
        now = write_data(repo, args.cards)
        for i, n in enumerate(int(x) for x in args.labels.split(",")):
            labels = Path(tmp) / f"labels_{n}.parquet"
            write_labels(labels, n, args.cards, now, seed=1 + i)
            out = Path(tmp) / f"feast_{n}.parquet"
            proc = subprocess.run([args.feast_python, "-c", FEAST_SIDE, str(repo), str(labels),
                                   str(out), str(N_VIEWS), str(N_FEAT), str(args.repeat)],
                                  capture_output=True, text=True, cwd=repo)
            if proc.returncode:
                sys.exit(f"Feast failed:\n{proc.stderr[-3000:]}")
            feast_run = json.loads(proc.stdout.strip().splitlines()[-1])
            red_s = float("inf")
            for _ in range(args.repeat):
                seconds, table = redline_side(repo, labels)
                red_s = min(red_s, seconds)
            row = {"labels": n, "cards": args.cards, "feast_s": round(feast_run["seconds"], 3),
                   "redline_s": round(red_s, 3),
                   "speedup": round(feast_run["seconds"] / red_s, 3),
                   **compare(pd.read_parquet(out), table)}
            print(json.dumps(row), flush=True)
            results.append(row)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
