"""benchmarks/models/gpu_check.py on a machine without CUDA: it says so first, judges fp16 on the
real task's held-out rows at the batcher's batch sizes, and prints an accuracy-only verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # trains a small classifier in a child process


def test_gpu_check_on_cpu_judges_fp16_on_the_real_task(tmp_path: Path) -> None:
    assert "CUDAExecutionProvider" not in ort.get_available_providers(), \
        "the suite runs on the CPU build of onnxruntime (the dev extra installs it)"
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/models/gpu_check.py", "--out", str(out),
         "--task-hidden", "32", "--latency-seconds", "0.02"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("CPU ONLY: no CUDA execution provider in this onnxruntime build")
    verdict = [line for line in done.stdout.splitlines() if line.startswith("VERDICT: ")]
    assert len(verdict) == 1 and "measured on the CPU only" in verdict[0]
    assert "speed is not judged" in verdict[0]
    result = json.loads(out.read_text())
    judged = result["fp16_judgement"]
    assert judged["held_out_rows"] == 899  # half of scikit-learn's 1,797 digits
    assert [r["batch"] for r in judged["rows"]] == [1, 8, 32, 64]
    for row in judged["rows"]:  # a trained classifier: its scores come from the real rows
        assert row["fp32"]["accuracy"] > 0.85 and row["fp32"]["auc"] > 0.95
        assert abs(row["fp16"]["accuracy"] - row["fp32"]["accuracy"]) < 0.05
        assert row["fp32_us"]["p50"] > 0 and row["fp16_us"]["p50"] > 0
    assert result["cuda"] is False and "throughput" not in result
    assert "no GPU execution provider" in result["optimize_fp16"]["reason"]
