"""Prepare the Feast peer's data once, in its own environment: repository, model, snapshot.

    python prepare.py DATA [CARDS]          # CARDS: 100,000 unless given

Writes into DATA: ``repo/`` (a Feast repository: entity ``card``, views ``fv0``..``fv4`` of 8
float32 features each, one Parquet file per view with every card's row at a time in the last
two hours, TTL one day, Redis online store, file offline store), materialized into a private
``redis-server`` on a free port, whose snapshot is then saved as ``dump.rdb`` and the server
stopped; ``model.onnx`` (a 100-tree gradient-boosting classifier over the 40 features, input
``input`` [N, 40], outputs ``label`` and ``probabilities``); ``peer.json`` (what was made, and
the times). Runs copy the repository and snapshot (``store.py``) and serve them on Redis of their
own.
"""

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

N_VIEWS, N_FEATS = 5, 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_repo(repo: Path, cards: int, port: int) -> datetime:
    """The repository's files and its Parquet sources; returns the time the rows lead up to."""
    (repo / "data").mkdir(parents=True, exist_ok=True)
    (repo / "feature_store.yaml").write_text(textwrap.dedent(f"""\
        project: feastbench
        registry: data/registry.db
        provider: local
        online_store:
          type: redis
          connection_string: "127.0.0.1:{port}"
        offline_store:
          type: file
        entity_key_serialization_version: 3
        """))
    rng = np.random.default_rng(0)
    now = datetime.now(UTC).replace(microsecond=0)
    for v in range(N_VIEWS):
        df = pd.DataFrame({"card": np.arange(cards, dtype=np.int64)})
        for j in range(N_FEATS):
            df[f"fv{v}_f{j}"] = rng.standard_normal(cards).astype(np.float32)
        df["event_timestamp"] = now - pd.to_timedelta(rng.integers(60, 7200, cards), unit="s")
        df["created"] = now
        df.to_parquet(repo / "data" / f"fv{v}.parquet", index=False)
    lines = ["from datetime import timedelta",
             "from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType",
             "from feast.types import Float32", "",
             'card = Entity(name="card", join_keys=["card"], value_type=ValueType.INT64)', ""]
    for v in range(N_VIEWS):
        fields = ", ".join(f'Field(name="fv{v}_f{j}", dtype=Float32)' for j in range(N_FEATS))
        lines += [f'fv{v}_src = FileSource(name="fv{v}_src", path="data/fv{v}.parquet", '
                  'timestamp_field="event_timestamp", created_timestamp_column="created")',
                  f'fv{v} = FeatureView(name="fv{v}", entities=[card], ttl=timedelta(days=1), '
                  f'schema=[{fields}], online=True, source=fv{v}_src)', ""]
    lines.append("all_features = FeatureService(name=\"all_features\", features=["
                 + ", ".join(f"fv{v}" for v in range(N_VIEWS)) + "])")
    (repo / "features.py").write_text("\n".join(lines) + "\n")
    return now


def train_model(out: Path) -> None:
    """A gradient-boosting classifier on random rows of the 40 features, as ONNX."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.ensemble import GradientBoostingClassifier

    rng = np.random.default_rng(0)
    x = rng.standard_normal((5000, N_VIEWS * N_FEATS)).astype(np.float32)
    y = ((x @ rng.standard_normal(N_VIEWS * N_FEATS) + 0.5 * rng.standard_normal(5000)) > 0)
    clf = GradientBoostingClassifier(n_estimators=100, max_depth=3, random_state=0)
    clf.fit(x, y.astype(np.int64))
    onx = convert_sklearn(clf, initial_types=[("input", FloatTensorType([None, x.shape[1]]))],
                          options={id(clf): {"zipmap": False}}, target_opset=17)
    out.write_bytes(onx.SerializeToString())


def main() -> None:
    data = Path(sys.argv[1]).resolve()
    cards = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    import redis
    from feast import FeatureStore

    shutil.rmtree(data / "repo", ignore_errors=True)
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="feast-prepare-"))
    server = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port",
                               str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                               "no", "--dir", str(work)], stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        t0 = time.perf_counter()
        now = write_repo(data / "repo", cards, port)
        written = time.perf_counter() - t0
        t0 = time.perf_counter()
        # The CLI, as a user runs it (it also puts the repository on the import path).
        subprocess.run([str(Path(sys.executable).parent / "feast"), "apply"],
                       cwd=data / "repo", check=True, stdout=subprocess.DEVNULL)
        applied = time.perf_counter() - t0
        t0 = time.perf_counter()
        FeatureStore(repo_path=str(data / "repo")).materialize(
            start_date=now - timedelta(days=1), end_date=now + timedelta(minutes=1))
        materialized = time.perf_counter() - t0
        client.save()
        shutil.copy(work / "dump.rdb", data / "dump.rdb")
        train_model(data / "model.onnx")
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    info = {"cards": cards, "views": N_VIEWS, "features_per_view": N_FEATS,
            "parquet_s": round(written, 2), "apply_s": round(applied, 2),
            "materialize_s": round(materialized, 2)}
    (data / "peer.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
