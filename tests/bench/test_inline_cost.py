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
