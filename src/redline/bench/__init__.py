"""``redline bench``: an open-loop load generator with HDR latency reports.

Public face: :func:`run_load` (one measured run), :func:`find_max` (highest rate within a p99
objective), :class:`LoadSpec` and :class:`BenchResult`.
"""

from redline.bench.runner import BenchResult, LoadSpec, find_max, run_load

__all__ = ["BenchResult", "LoadSpec", "find_max", "run_load"]
