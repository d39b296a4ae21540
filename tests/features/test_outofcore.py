"""The out-of-core engine (hash partitions on disk, built by the kernel in processes) gives the
in-memory training set exactly, on hostile streams with tiny budgets (many partitions) and on the
fraud example; bad input is one clear error and leaves nothing at --out."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from redline.features.offline import build_training_set, read_table
from redline.features.outofcore import build_on_disk
from tests.features.test_asof import _labels
from tests.features.test_cli import run
from tests.features.test_training_serving import DEFS, IDS_DEFS, _stream

ROOT = Path(__file__).resolve().parents[2]
FRAUD = ROOT / "examples" / "fraud"
TX_DEFS = str(Path(__file__).with_name("defs_tx.py"))


def _write_stream(tmp: Path, seed: int, ids: bool) -> tuple[Path, Path]:
    events, arrivals, _ = _stream(seed, n=700)
    for i, e in enumerate(events):
        if ids:
            e["event_id"] = f"e{i % 150}" if i % 5 else i % 150  # integer-like ids too
        if i % 9 == 0:
            e["card_id"] = int(e["card_id"][1:])  # integer entity 3 is entity "3"
    ev = tmp / "events.jsonl"
    ev.write_bytes(b"\n".join(orjson.dumps({**e, "_arrival_ms": a})
                              for e, a in zip(events, arrivals, strict=True)))
    labels = _labels(events, arrivals, seed)
    labels.loc[::7, "card_id"] = labels.loc[::7, "card_id"].str[-1]  # "0".."3" and "y"
    lb = tmp / "labels.csv"
    labels.to_csv(lb, index=False)
    return ev, lb


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True)


@pytest.mark.parametrize("ids", [False, True], ids=["no-ids", "event-ids"])
def test_disk_engine_equals_memory_on_hostile_streams(tmp_path: Path, ids: bool) -> None:
    defs = IDS_DEFS if ids else DEFS
    ev, lb = _write_stream(tmp_path, 51 + ids, ids)
    memory = build_training_set(defs, read_table(ev), read_table(lb))
    assert (memory["v:count_1m"] > 0).sum() > 50
    for parts, workers in ((1, 1), (7, 1)):  # the process pool: the fraud test
        out = tmp_path / f"disk{parts}.parquet"
        rows, _, _ = build_on_disk(defs, str(ev), str(lb), str(out), parts=parts,
                                   workers=workers, tmp_dir=str(tmp_path))
        assert rows == len(memory)
        pd.testing.assert_frame_equal(pd.read_parquet(out), memory)  # label order kept
    assert not list(tmp_path.glob("redline-training-*")), "temporary partitions left behind"


def _fraud_inputs(tmp: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(FRAUD))
    try:
        import generate
    finally:
        sys.path.remove(str(FRAUD))
    generate.write(generate.generate(cards=150, days=1.5, seed=3), tmp / "data")
    events = read_table(tmp / "data" / "events.jsonl")
    ev = tmp / "events.parquet"
    events.to_parquet(ev)
    tx = read_table(tmp / "data" / "transactions.jsonl")
    tx = tx.assign(ts_s=tx["ts"] / 1000.0, hour=tx["ts"] // 3_600_000 % 24)
    lb = tmp / "labels.parquet"
    tx.to_parquet(lb)
    return ev, lb


@pytest.mark.slow
def test_fraud_example_is_the_same_on_memory_and_disk(tmp_path: Path, capsys) -> None:
    ev, lb = _fraud_inputs(tmp_path)
    tables = {}
    for engine in ("memory", "disk"):
        out = tmp_path / f"{engine}.parquet"
        code, text, err = run(capsys, "features", "training-set", "-d",
                              str(FRAUD / "features.py"), "--events", str(ev), "--labels",
                              str(lb), "--out", str(out), "--engine", engine,
                              "--memory-budget", "64MB")
        assert code == 0, err
        assert f"({engine})" in text
        tables[engine] = _sorted(pd.read_parquet(out))
    mem, disk = tables["memory"], tables["disk"]
    assert len(mem) > 300 and (mem["card_activity:count_1h"] > 0).mean() > 0.5
    assert mem.to_csv(index=False).encode() == disk.to_csv(index=False).encode()


def _bad(capsys, tmp: Path, events: Path, labels: Path, match: str, *extra: str) -> None:
    out = tmp / "train.parquet"
    for engine in ("memory", "disk"):
        code, _, err = run(capsys, "features", "training-set", "-d", TX_DEFS, "--events",
                           str(events), "--labels", str(labels), "--out", str(out),
                           "--engine", engine, *extra)
        assert code == 2 and match in err, (engine, err)
        assert not out.exists() and not list(tmp.glob(".train.parquet.*"))


def test_bad_inputs_are_clear_errors_and_write_nothing(tmp_path: Path, capsys) -> None:
    t0 = 1_767_225_600_000
    events = pd.DataFrame({"card_id": ["c1", "c2"] * 50, "amount": np.arange(100.0),
                           "merchant": "m", "ts": t0 + np.arange(100) * 1000})
    ev = tmp_path / "events.parquet"
    events.to_parquet(ev)
    no_entity = tmp_path / "no_entity.csv"
    pd.DataFrame({"ts": [t0 + 5000]}).to_csv(no_entity, index=False)
    _bad(capsys, tmp_path, ev, no_entity, "labels lack column 'card_id'")
    seconds = tmp_path / "seconds.parquet"
    pd.DataFrame({"card_id": ["c1"], "ts": [t0 // 1000 + 5]}).to_parquet(seconds)
    _bad(capsys, tmp_path, ev, seconds, "multiply the column by 1000")
    ev_seconds = tmp_path / "ev_seconds.parquet"
    events.assign(ts=events["ts"] // 1000).to_parquet(ev_seconds)
    good = tmp_path / "labels.parquet"
    pd.DataFrame({"card_id": ["c1"], "ts": [t0 + 5000]}).to_parquet(good)
    _bad(capsys, tmp_path, ev_seconds, good, "multiply the column by 1000", "--engine", "disk")
    float_ids = tmp_path / "float_ids.parquet"
    events.assign(card_id=np.arange(100.0)).to_parquet(float_ids)
    _bad(capsys, tmp_path, float_ids, good, "column 'card_id' is double")
    text_times = tmp_path / "text_times.parquet"
    pd.DataFrame({"card_id": ["c1"], "ts": [True]}).to_parquet(text_times)
    _bad(capsys, tmp_path, ev, text_times, "column 'ts' is bool")


def test_integer_ids_in_events_meet_their_texts_in_labels(tmp_path: Path) -> None:
    """Events with int64 ids (Parquet) and labels with the same ids as text: one entity each, so
    they must land in the same partition."""
    t0 = 1_767_225_600_000
    events = pd.DataFrame({"card_id": np.arange(400) % 37, "amount": np.arange(400.0),
                           "merchant": "m", "n": 1, "flag": True,
                           "ts": t0 + np.arange(400) * 300})
    ev = tmp_path / "events.parquet"
    events.to_parquet(ev)
    lb = tmp_path / "labels.jsonl"
    lb.write_bytes(b"\n".join(orjson.dumps({"card_id": str(i % 40), "ts": t0 + 60_000 + i * 500})
                              for i in range(200)))
    memory = build_training_set(DEFS, read_table(ev), read_table(lb))
    assert (memory["v:count_1m"] > 0).sum() > 150
    out = tmp_path / "disk.parquet"
    build_on_disk(DEFS, str(ev), str(lb), str(out), parts=5, workers=1)
    pd.testing.assert_frame_equal(pd.read_parquet(out), memory)
