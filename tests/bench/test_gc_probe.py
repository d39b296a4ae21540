"""The benchmarks' garbage-collection probe records collections and the young census."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "benchmarks" / "pipeline" / "gc_probe"

SCRIPT = """
def cycle():  # a closure that names itself: freed only by the collector
    def again():
        return again
    return again
for i in range(200_000):
    f = cycle()
# marker-gc-probe-test (the probe writes every 2 s and at exit)
"""


def test_probe_records_collections_and_names_the_cycle(tmp_path: Path) -> None:
    out = tmp_path / "gc"
    env = {**os.environ, "PYTHONPATH": f"{PROBE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "GCPROBE_OUT": str(out), "GCPROBE_YOUNG": "1", "GCPROBE_MATCH": "marker-gc-probe"}
    subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, timeout=60,
                   capture_output=True)
    files = list(tmp_path.glob("gc.*"))
    assert len(files) == 1  # only the matching process
    doc = json.loads(files[0].read_text())
    young = doc["collections"]["0"]
    assert len(young) > 50 and sum(row[2] for row in young) > 100_000  # the cycles, collected
    assert all(row[0] >= 0 and row[1] >= 0 for row in young)
    names = {name for census in doc["young"] for name, _ in census["code"]}
    assert "cycle.<locals>.again" in names
    summary = subprocess.run([sys.executable, str(ROOT / "benchmarks/pipeline/gc_summary.py"),
                              str(out)], capture_output=True, text=True, check=True).stdout
    assert json.loads(summary.splitlines()[0])["gen0"]["n"] == len(young)
