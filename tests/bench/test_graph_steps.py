"""The inference-graph steps benchmark (``make bench --areas graph``) runs end to end on a small
catalogue and reports every step (it once broke on a moved import and nothing noticed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_graph_steps_reports_every_step(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    subprocess.run([sys.executable, "-m", "benchmarks.pipeline.graph_steps", "--cpu",
                    "--items", "3000", "--dim", "16", "--requests", "5", "--json-out", str(out)],
                   cwd=ROOT, check=True, capture_output=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"})
    result = json.loads(out.read_text())
    assert set(result["steps_us"]) == {"query", "retrieve exact", "retrieve hnsw", "rank rows",
                                       "ranker run (K rows)", "rank order", "rules"}
    assert all(p50 > 0 and p99 >= p50 for p50, p99 in result["steps_us"].values())
    assert 0.5 < result["recall"] <= 1.0
