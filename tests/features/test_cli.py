"""`redline features ...` and `redline ingest file` end to end, in-process through `main`."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pandas as pd
import pytest

from redline.cli import main

DEFS = str(Path(__file__).with_name("defs_tx.py"))
T0 = 1_767_225_600_000


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def _config(tmp_path: Path, **features: str) -> str:
    lines = ["features:", f"  definitions: {DEFS}", f"  registry: {tmp_path / 'registry'}"]
    lines += [f"  {k}: {v}" for k, v in features.items()]
    path = tmp_path / "redline.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_plan_apply_list(tmp_path: Path, capsys) -> None:
    cfg = _config(tmp_path)
    code, out, _ = run(capsys, "features", "plan", "--config", cfg)
    assert code == 0 and out.startswith("create") and "card_stats" in out
    code, out, _ = run(capsys, "features", "apply", "--config", cfg)
    assert code == 0 and '"card_stats"' in out
    code, out, _ = run(capsys, "features", "plan", "--config", cfg)
    assert out.startswith("unchanged")
    code, out, _ = run(capsys, "features", "list", "--config", cfg)
    assert "card_stats:amount_mean_1h" in out and "default nan" in out


def test_missing_definitions_is_a_clear_error(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "features", "plan")
    assert code == 2 and "no feature definitions" in err and "--definitions" in err


def test_training_set_and_served_log_verification(tmp_path: Path, capsys) -> None:
    events = [{"card_id": f"c{i % 3}", "amount": float(i % 17), "merchant": f"m{i % 5}",
               "ts": T0 + i * 1000} for i in range(600)]
    (tmp_path / "events.jsonl").write_bytes(b"\n".join(orjson.dumps(e) for e in events))
    labels = pd.DataFrame({"card_id": ["c0", "c1", "c2", "c9"],
                           "ts": [T0 + 100_000, T0 + 300_000, T0 + 599_000, T0 + 10],
                           "label": [0, 1, 0, 1]})
    labels.to_csv(tmp_path / "labels.csv", index=False)
    out_path = tmp_path / "train.parquet"
    code, out, err = run(capsys, "features", "training-set", "-d", DEFS, "--events",
                         str(tmp_path / "events.jsonl"), "--labels", str(tmp_path / "labels.csv"),
                         "--out", str(out_path))
    assert code == 0, err
    table = pd.read_parquet(out_path)
    assert table["card_stats:count_1h"].tolist() == [34, 100, 200, 0]
    assert table["label"].tolist() == [0, 1, 0, 1]
    # a log of values served: correct values pass, one tampered value is reported
    served = table.drop(columns=["label"])
    served.to_csv(tmp_path / "served.csv", index=False)
    code, out, _ = run(capsys, "features", "verify", "-d", DEFS, "--served",
                       str(tmp_path / "served.csv"), "--events", str(tmp_path / "events.jsonl"))
    assert code == 0 and out.startswith("OK served")
    served.loc[1, "card_stats:amount_sum_1h"] += 0.5
    served.to_csv(tmp_path / "served.csv", index=False)
    code, out, _ = run(capsys, "features", "verify", "-d", DEFS, "--served",
                       str(tmp_path / "served.csv"), "--events", str(tmp_path / "events.jsonl"))
    assert code == 1 and "card_stats:amount_sum_1h: 1 mismatches" in out


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_verify_command_on_both_stores(store: str, capsys, request) -> None:
    args = ["features", "verify", "-d", DEFS, "--events-per-view", "600", "--store", store]
    if store == "redis":
        args += ["--redis-url", request.getfixturevalue("redis_server").url]
    code, out, _ = run(capsys, *args)
    assert code == 0, out
    assert out.startswith(f"OK card_stats ({store})")


def test_verify_unreachable_redis(capsys) -> None:
    code, _, err = run(capsys, "features", "verify", "-d", DEFS, "--redis-url",
                       "redis://127.0.0.1:1/0")
    assert code == 2 and "store_unavailable" in err


def test_ingest_file_reports_counts(tmp_path: Path, capsys) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(orjson.dumps({"card_id": "c", "amount": 1.0, "merchant": "m", "ts": T0})
                     + b"\n" + b'{"card_id": "c"}\n')
    code, out, err = run(capsys, "ingest", "file", "-d", DEFS, str(path))
    assert code == 0
    assert json.loads(out)["accepted"] == 1 and json.loads(out)["dead"] == 1
    assert "missing field" in err


def test_stream_ingest_at_an_unreachable_cluster_is_a_clear_error(tmp_path: Path, capsys) -> None:
    """Stream ingest runs on a cluster now (tests/features/test_cluster.py); with nothing
    listening it says so, with a code, not a traceback."""
    from tests.conftest import free_port

    cfg = _config(tmp_path, store="redis", redis_cluster="true",
                  redis_url=f"redis://127.0.0.1:{free_port()}/0")
    code, _, err = run(capsys, "ingest", "redis-stream", "--config", cfg)
    assert code == 2 and "Traceback" not in err
    assert "store_unavailable" in err or "unavailable" in err.lower()
