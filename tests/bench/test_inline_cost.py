"""The in-process monitoring cost benchmark runs, answers every call, and splits each call
into the part before the answer and the rest."""

from __future__ import annotations

import asyncio

from benchmarks.observability.inline_cost import measure


def test_inline_cost_measures_both_servers_before_and_after_the_answer() -> None:
    out = asyncio.run(measure(rounds=2, calls=50))  # asserts every call answered 200
    for name in ("off", "on"):
        call, before = out[f"{name}_call_ns"], out[f"{name}_until_respond_ns"]
        assert 0 < before["best"] <= call["best"]
        assert before["median"] <= call["median"]
    assert set(out["added_call_ns"]) == {"median", "best"}


def test_inline_cost_measures_a_graph() -> None:
    """``--api graph``: python_compare.py's three-step graph, every call answered 200 (on
    the spot, or queued where the test's SIGALRM keeps the Python steps off the loop)."""
    out = asyncio.run(measure(rounds=2, calls=30, api="graph", drain=True))
    assert 0 < out["off_until_respond_ns"]["best"] <= out["off_call_ns"]["best"]
    assert out["on_cpu_ns"]["median"] > 0
