"""The cascade benchmark: its ratios and page table from known rounds, and its whole run for a
moment (a small MLP, one round)."""

from __future__ import annotations

import pytest

from benchmarks.models import cascade_area, cascade_compare


def _cell(r: int, graph: str, c: int, p50: float, p99: float, acc: float,
          rate: float = 0.0) -> dict:  # type: ignore[type-arg]
    answered = {"logistic": 0.6, "mlp": 0.4} if graph == "cascade" else {}
    load = {"rate": rate} if rate else {"concurrency": c}
    return {"round": r, "graph": graph, **load, "accuracy": acc, "p50_ms": p50,
            "p99_ms": p99, "errors": 0, "answered": answered}


def test_the_cascade_is_judged_against_the_mlp_round_by_round() -> None:
    cells = [_cell(0, "cascade", 1, 1.0, 4.0, 0.995), _cell(0, "mlp", 1, 2.0, 5.0, 0.996),
             _cell(0, "logistic", 1, 0.5, 2.0, 0.84),
             _cell(1, "cascade", 1, 1.5, 6.0, 0.995), _cell(1, "mlp", 1, 2.0, 5.0, 0.996),
             _cell(1, "logistic", 1, 0.5, 2.0, 0.84)]
    summary = cascade_compare.summarize(cells, [1])["c1"]
    assert summary["p50_ms"]["ratio"] == pytest.approx((0.5 + 0.75) / 2)
    assert summary["p50_ms"]["rounds_met"] == 2
    assert summary["p99_ms"]["min"] == pytest.approx(0.8)
    assert summary["p99_ms"]["max"] == pytest.approx(1.2)
    assert summary["p99_ms"]["rounds_met"] == 1
    assert summary["accuracy_points_below_mlp"] == pytest.approx(0.1)
    result = {"tickets": 800, "hidden": 2048, "threshold": 0.97, "rounds": 2,
              "concurrency": [1], "cells": cells, "summary": {"c1": summary}}
    body, found = cascade_area.render("stamp", result)
    assert [t.met for t in found] == [True, True, True]  # p99's median ratio is exactly 1.0
    assert "| cascade (logistic, then MLP) | c=1 | 0.9950 | 1.250 (1.000–1.500) |" in body
    assert "logistic 60%, mlp 40%" in body


def test_open_loop_cells_are_judged_at_their_rate_beside_the_closed_loop() -> None:
    """An open-loop rate is a load of its own: its cells are compared with the MLP's at the
    same rate, never with a closed-loop cell, and the page names it."""
    cells = [_cell(0, "cascade", 1, 1.0, 3.0, 0.995), _cell(0, "mlp", 1, 2.0, 2.9, 0.996),
             _cell(0, "logistic", 1, 0.5, 1.0, 0.84),
             _cell(0, "cascade", 0, 1.2, 4.0, 0.995, rate=300),
             _cell(0, "mlp", 0, 3.0, 8.0, 0.996, rate=300),
             _cell(0, "logistic", 0, 0.6, 1.5, 0.84, rate=300)]
    summary = cascade_compare.summarize(cells, [1], (300.0,))
    assert summary["r300"]["p99_ms"]["ratio"] == pytest.approx(0.5)
    assert summary["c1"]["p99_ms"]["ratio"] == pytest.approx(3.0 / 2.9)
    result = {"tickets": 800, "hidden": 2048, "threshold": 0.97, "rounds": 1,
              "concurrency": [1], "rates": [300.0], "cells": cells, "summary": summary}
    body, found = cascade_area.render("stamp", result)
    by = {t.name: t.met for t in found}
    assert by["cascade p99 over the MLP's, open loop at 300/s"] is True
    assert by["cascade p99 over the MLP's, c=1"] is False
    assert "| MLP alone | open loop at 300/s | 0.9960 | 3.000 (3.000–3.000) |" in body
    assert "| logistic model alone | open loop" not in body  # a reference at c=1 only


@pytest.mark.slow
def test_a_small_run_end_to_end() -> None:
    result = cascade_compare.main(["--tickets", "300", "--hidden", "32", "--rounds", "1",
                                   "--concurrency", "2", "--rates", "100"])
    assert {x.get("rate") for x in result["cells"]} == {None, 100.0}
    assert set(result["summary"]) == {"c2", "r100"}
    opened = [x for x in result["cells"] if x.get("rate")]
    assert all(x["errors"] == 0 and x["p99_ms"] > 0 for x in opened)
    cells = {x["graph"]: x for x in result["cells"] if not x.get("rate")}
    assert set(cells) == {"cascade", "logistic", "mlp"}
    assert all(x["errors"] == 0 and x["p50_ms"] > 0 for x in cells.values())
    assert sum(cells["cascade"]["answered"].values()) == pytest.approx(1.0)
    assert cells["logistic"]["accuracy"] > 0.5  # answers read and compared (chance: 0.25)
