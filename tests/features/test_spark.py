"""The Spark engine gives the in-memory builder's rows: on the hostile generated streams (late,
out-of-order, future, duplicate and malformed events, ties, event ids, integer ids, tile
boundaries) as JSON lines, typed Parquet and CSV text, and on the fraud example through the CLI,
with several entities, sources and request transforms. One local Spark session serves them all
(a JVM start is seconds)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest

from redline.errors import InvalidInput
from redline.features import FeatureDefinitions
from redline.features import spark as spark_engine  # redline[spark] is part of dev
from redline.features.offline import EventLog, build_training_set, read_events
from tests.features.test_cli import run
from tests.features.test_training_serving import DEFS, IDS_DEFS, _stream

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a JVM start on a busy machine
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    problem = spark_engine.java_problem()
    if problem:
        pytest.fail(problem)  # tools/services.d installs Java: its absence is a broken setup
    session = spark_engine.session("local[2]", shuffle_partitions=2)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _events(seed: int, ids: bool) -> tuple[list[dict[str, Any]], list[int]]:
    """Three streams over disjoint cards (one with integer ids), merged: twelve entities."""
    events, arrivals = [], []
    for k, rename in enumerate([lambda c: f"a{c}", lambda c: 100 + int(c[1:]), str]):
        evs, arr, _ = _stream(seed + k, n=400)
        for i, e in enumerate(evs):
            e["card_id"] = rename(e["card_id"])
            if ids:
                e["event_id"] = f"{k}-e{i % 120}"  # redeliveries by id, some past the window
        events += evs
        arrivals += arr
    return events, arrivals


def _labels(events: list[dict[str, Any]], arrivals: list[int], seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    cards = sorted({str(e["card_id"]) for e in events}) + ["nobody"]
    times = [rng.choice(arrivals) + rng.choice([0, -1, 1, 999, 61_000]) for _ in range(300)]
    times += [(a // 5000) * 5000 for a in arrivals[::40]]  # tile boundaries
    return pd.DataFrame({"card_id": [rng.choice(cards) for _ in times], "ts": times,
                         "weight": np.arange(len(times), dtype=np.float64)})


def _same_rows(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Equal after sorting, value for value and bit for bit (NaN equals NaN)."""
    assert list(got.columns) == list(want.columns)
    keys = list(want.columns)
    got = got.sort_values(keys, kind="stable").reset_index(drop=True)
    want = want.sort_values(keys, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_exact=True, check_dtype=False)


@pytest.mark.parametrize("defs", [DEFS, IDS_DEFS], ids=["no-ids", "event-ids"])
def test_json_lines_give_the_in_memory_rows(spark: Any, defs: FeatureDefinitions) -> None:
    events, arrivals = _events(40, ids=defs is IDS_DEFS)
    lines = [orjson.dumps({**e, "_arrival_ms": a}) for e, a in zip(events, arrivals, strict=True)]
    lines += [b"not json", b"[1, 2]"]
    labels = _labels(events, arrivals, 40)
    want = build_training_set(defs, EventLog(lines), labels)
    assert (want["v:count_1m"] > 0).sum() > 100
    ev = spark.createDataFrame([(x.decode(),) for x in lines], "value string")
    got = spark_engine.training_set(defs, ev, spark.createDataFrame(labels), events_as="json",
                                    buckets=5).toPandas()
    _same_rows(got, want)


def test_parquet_and_csv_give_the_in_memory_rows(spark: Any, tmp_path: Path) -> None:
    events, arrivals = _events(50, ids=False)
    rows = [{**e, "_arrival_ms": a} for e, a in zip(events, arrivals, strict=True)
            if type(e["amount"]) is float]
    typed = pd.DataFrame(rows).assign(card_id=lambda d: d["card_id"].astype(str))
    typed.loc[::17, "n"] = np.nan  # an int field read as floats: 3.0 is 3, NaN is missing
    typed.loc[::11, "card_id"] = None
    typed.loc[::13, "amount"] = np.inf
    labels = _labels(events, arrivals, 50)
    typed.to_parquet(tmp_path / "events.parquet", index=False)
    pd.DataFrame([{**e, "_arrival_ms": a} for e, a in zip(events, arrivals, strict=True)]).to_csv(
        tmp_path / "events.csv", index=False)
    for name, want_events in [("events.parquet", pd.read_parquet(tmp_path / "events.parquet")),
                              ("events.csv", read_events(tmp_path / "events.csv"))]:
        want = build_training_set(DEFS, want_events, labels)
        assert (want["v:count_1m"] > 0).sum() > 100, name
        ev, events_as = spark_engine.read_events(spark, str(tmp_path / name))
        got = spark_engine.training_set(DEFS, ev, spark.createDataFrame(labels),
                                        events_as=events_as, buckets=3).toPandas()
        _same_rows(got, want)


def test_csv_ids_and_values_are_text_as_on_the_other_engines(spark: Any, tmp_path: Path) -> None:
    """Cards 007 and 7 are two entities in events and label rows alike, and numeric-looking
    merchants are a str field's values (the rows the memory and disk engines give)."""
    from redline.features import load_definitions
    from redline.features.offline import label_keys
    from tests.features.test_outofcore import TX_DEFS, text_csv

    ev_path, lb_path, want = text_csv(tmp_path)
    defs = load_definitions(TX_DEFS)
    ev, events_as = spark_engine.read_events(spark, str(ev_path))
    labels = spark_engine.read_labels(spark, str(lb_path), label_keys(defs))
    got = spark_engine.training_set(defs, ev, labels, events_as=events_as).toPandas()
    got = got.sort_values("card_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[list(want.columns)], want, check_dtype=False)
    assert got["card_stats:merchant_distinct_1h"].round().tolist() == [3.0, 1.0]


def test_fraud_example_on_spark_equals_in_memory_through_the_cli(spark: Any, tmp_path: Path,
                                                                  capsys: Any) -> None:
    """Two entities (card, merchant), three sources, late labels, two request transforms."""
    subprocess.run([sys.executable, str(ROOT / "examples/fraud/generate.py"), "--out",
                    str(tmp_path), "--cards", "60", "--days", "2"], check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    txns = [orjson.loads(x) for x in (tmp_path / "transactions.jsonl").read_bytes().splitlines()]
    pd.DataFrame({"card_id": [t["card_id"] for t in txns],
                  "merchant_id": [t["merchant_id"] for t in txns],
                  "ts": [t["ts"] - 1 for t in txns], "amount": [t["amount"] for t in txns],
                  "ts_s": [t["ts"] / 1000.0 for t in txns]}).to_parquet(tmp_path / "rows.parquet")
    args = ["features", "training-set", "-d", str(ROOT / "examples/fraud/features.py"),
            "--events", str(tmp_path / "events.jsonl"), "--labels", str(tmp_path / "rows.parquet")]
    code, _, err = run(capsys, *args, "--out", str(tmp_path / "mem.parquet"))
    assert code == 0, err
    out = tmp_path / "spark.parquet"
    code, _, err = run(capsys, *args, "--out", str(out), "--engine", "spark")
    assert code == 0, err
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # renamed into place
    want = pd.read_parquet(tmp_path / "mem.parquet")
    got = pd.read_parquet(out)
    assert len(want) == len(txns) > 300 and want["card_activity:count_1d"].gt(0).sum() > 200
    assert list(got.dtypes) == list(want.dtypes)
    _same_rows(got, want)
    # a bad label table: one clear error, nothing at --out, from the CLI's checks ...
    bad_rows = pd.DataFrame({"card_id": ["c1"], "merchant_id": ["m1"], "ts": ["yesterday"],
                             "amount": [1.0], "ts_s": [1.0]})
    bad_rows.to_parquet(tmp_path / "bad.parquet")
    bad = tmp_path / "bad-out.parquet"
    code, _, err = run(capsys, *args[:-1], str(tmp_path / "bad.parquet"), "--out", str(bad),
                       "--engine", "spark")
    assert code == 2 and "epoch milliseconds" in err.splitlines()[-1], err
    # ... and from inside the Spark tasks when the API is given it
    from redline.features import load_definitions

    ev, events_as = spark_engine.read_events(spark, str(tmp_path / "events.jsonl"))
    table = spark_engine.training_set(load_definitions(ROOT / "examples/fraud/features.py"), ev,
                                      spark.createDataFrame(bad_rows), events_as=events_as)
    with pytest.raises(InvalidInput, match="'ts' must be epoch milliseconds"):
        spark_engine.write_parquet(table, str(bad))
    assert not bad.exists() and not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_spark_without_java_says_how_to_install_it(tmp_path: Path) -> None:
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "PYTHONPATH": str(ROOT / "src")}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    (tmp_path / "e.jsonl").write_text('{"card_id": "c1", "ts": 1767225600000}\n')
    (tmp_path / "l.csv").write_text("card_id,ts\nc1,1767225600000\n")
    out = tmp_path / "t.parquet"
    proc = subprocess.run(
        [sys.executable, "-m", "redline.cli", "features", "training-set", "-d",
         str(ROOT / "tests/features/defs_tx.py"), "--events", str(tmp_path / "e.jsonl"),
         "--labels", str(tmp_path / "l.csv"), "--out", str(out), "--engine", "spark"],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    err = proc.stderr + proc.stdout
    assert "Java 17" in err and "openjdk-17-jre-headless" in err and "no-java" in err, err
    assert "Traceback" not in err and not out.exists()
