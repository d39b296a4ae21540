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

from redline.features.offline import build_training_set, read_events, read_table
from redline.features.outofcore import build_on_disk
from tests.features.test_asof import _labels
from tests.features.test_cli import run
from tests.features.test_training_serving import DEFS, IDS_DEFS, _stream

ROOT = Path(__file__).resolve().parents[2]
FRAUD = ROOT / "examples" / "fraud"
TX_DEFS = str(Path(__file__).with_name("defs_tx.py"))


# CSV cells are text: whole columns of numeric-looking ids and values, which pandas would read
# as numbers (merging 007 with 7, and turning a str field's "12" into 12, rejected by its type)
TEXT_IDS = {"c0": "007", "c1": "7", "c2": "12", "c3": "0", "nobody": "404"}


def _write_stream(tmp: Path, seed: int, ids: bool, csv: bool = False) -> tuple[Path, Path]:
    events, arrivals, _ = _stream(seed, n=700)
    for i, e in enumerate(events):
        if ids:
            e["event_id"] = f"e{i % 150}" if i % 5 else i % 150  # integer-like ids too
        if csv:
            e["card_id"], e["merchant"] = TEXT_IDS[e["card_id"]], e["merchant"][1:]
        elif i % 9 == 0:
            e["card_id"] = int(e["card_id"][1:])  # integer entity 3 is entity "3"
    rows = [{**e, "_arrival_ms": a} for e, a in zip(events, arrivals, strict=True)]
    labels = _labels(events, arrivals, seed)
    if csv:
        ev = tmp / "events.csv"
        pd.DataFrame(rows).to_csv(ev, index=False)
        labels["card_id"] = labels["card_id"].map(TEXT_IDS)
    else:
        ev = tmp / "events.jsonl"
        ev.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
        labels.loc[::7, "card_id"] = labels.loc[::7, "card_id"].str[-1]  # "0".."3" and "y"
    lb = tmp / "labels.csv"
    labels.to_csv(lb, index=False)
    return ev, lb


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True)


@pytest.mark.parametrize("ids,csv", [(False, False), (True, False), (True, True)],
                         ids=["no-ids", "event-ids", "event-ids-csv-text"])
def test_disk_engine_equals_memory_on_hostile_streams(tmp_path: Path, ids: bool,
                                                      csv: bool) -> None:
    defs = IDS_DEFS if ids else DEFS
    ev, lb = _write_stream(tmp_path, 51 + ids, ids, csv)
    # the reference reads as ingest reads: CSV events as text, label ids as text
    memory = build_training_set(defs, read_events(ev) if csv else read_table(ev),
                                pd.read_csv(lb, dtype={"card_id": str}))
    assert (memory["v:count_1m"] > 0).sum() > 50
    if csv:  # 007 and 7 are two entities; the str field's numeric-looking values count
        by_card = memory.groupby("card_id")["v:count_1m"].max()
        assert by_card["007"] > 0 and by_card["7"] > 0 and by_card["404"] == 0
        assert (memory["v:merchant_distinct_5m"] > 0).sum() > 50
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


def text_csv(tmp: Path) -> tuple[Path, Path, pd.DataFrame]:
    """Events and label rows in CSV whose columns all look numeric (cards 007 and 7, merchants
    1, 2, 3), for ``defs_tx.py``, and the rows ``redline ingest file`` would serve."""
    t0 = 1_767_225_600_000
    ev, lb = tmp / "text-events.csv", tmp / "text-labels.csv"
    ev.write_text("card_id,amount,merchant,ts\n"
                  f"007,1.5,1,{t0 + 1000}\n007,2.5,2,{t0 + 2000}\n7,3,3,{t0 + 3000}\n"
                  f"007,1,3,{t0 + 4000}\n")
    lb.write_text(f"card_id,ts\n007,{t0 + 10_000}\n7,{t0 + 10_000}\n")
    want = pd.DataFrame({"card_id": ["007", "7"], "ts": [t0 + 10_000] * 2,
                         "card_stats:count_1h": [3.0, 1.0],
                         "card_stats:amount_sum_1h": [5.0, 3.0]})
    return ev, lb, want


def test_csv_cells_are_text_on_the_memory_and_disk_engines(tmp_path: Path, capsys) -> None:
    """As `redline ingest file` reads them: 007 and 7 are two cards, and a str field whose
    values all look numeric counts them (3 distinct merchants, not 0)."""
    ev, lb, want = text_csv(tmp_path)
    for engine in ("memory", "disk"):
        out = tmp_path / f"{engine}.parquet"
        code, _, err = run(capsys, "features", "training-set", "-d", TX_DEFS, "--events",
                           str(ev), "--labels", str(lb), "--out", str(out), "--engine", engine)
        assert code == 0, err
        got = pd.read_parquet(out)
        assert got["card_id"].tolist() == ["007", "7"], engine
        for col in want.columns[1:]:
            assert got[col].tolist() == want[col].tolist(), (engine, col)
        assert got["card_stats:merchant_distinct_1h"].round().tolist() == [3.0, 1.0], engine
