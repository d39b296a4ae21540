"""The Python-model peer comparison runs: redline's side end to end for a moment, and its
ratios and page table from a known result (the peers run from their own environments, which a
test does not make)."""

from __future__ import annotations

import pytest

from benchmarks.models import python_area, python_compare


def _data() -> dict:  # type: ignore[type-arg]
    def cell(rps: float, p99: float, r: int) -> dict:  # type: ignore[type-arg]
        return {"rps": rps, "p50": p99 / 3, "p90": p99 / 2, "p99": p99, "ok": 100, "errors": 0,
                "cpu_us": 50.0, "client_cpu_us": 20.0, "server_cores": 0.9,
                "round": r}

    closed = {
        "redline": {1: [cell(9000, 0.3, 0), cell(8000, 0.4, 1)],
                    8: [cell(30000, 0.6, 0), cell(28000, 0.7, 1)]},
        "redline_onnx": {1: [cell(9500, 0.3, 0), cell(8100, 0.3, 1)],
                         8: [cell(33000, 0.6, 0), cell(30000, 0.6, 1)]},
        "triton": {1: [cell(5000, 0.5, 0), cell(4000, 0.6, 1)],
                   8: [cell(9000, 1.5, 0), cell(8000, 1.6, 1)]},
        "triton_batched": {1: [cell(4000, 0.5, 0), cell(3000, 0.6, 1)],
                           8: [cell(12000, 1.2, 0), cell(13000, 1.1, 1)]},
    }
    ladders = {name: [{"round": r, "max_rate": 4000 if "triton" in name else 15000,
                       "steps": []} for r in (0, 1)] for name in closed}
    return {"closed": closed, "ladders": ladders}


def _targets() -> list[python_compare.Target]:
    t = python_compare.Target
    return [t("redline", "redline", "rowsum", "redline", "rowsum"),
            t("redline_onnx", "redline_onnx", "rowsum", "redline", "rowsum_onnx"),
            t("triton", "triton", "rowsum", "triton", "rowsum"),
            t("triton_batched", "triton", "rowsum", "triton", "rowsum_batched")]


def test_each_ratio_is_against_the_peers_best_configuration_round_by_round() -> None:
    ratios = python_compare.ratios(_targets(), _data())
    c8 = ratios["rowsum_c8_rps_vs_triton"]
    assert c8["against"] == "triton_batched"  # the higher c=8 median of Triton's two
    assert c8["ratio"] == pytest.approx(29000 / 12500, abs=1e-3)
    assert c8["min"] == pytest.approx(28000 / 13000, abs=1e-3) and c8["rounds_met"] == "1/2"
    assert ratios["rowsum_c1_rps_vs_triton"]["against"] == "triton"
    assert ratios["rowsum_c8_rps_vs_onnx"]["met"] and ratios["rowsum_c8_p99_vs_triton"]["met"]
    assert "rowsum_c8_rps_vs_ray" not in ratios  # Ray not run: no ratio, no verdict
    result = {"p99_bound_ms": 5.0, "ratios": ratios,
              "cells": python_compare.summarize(_targets(), _data())}
    body, found = python_area.render("stamp", result)
    assert "| Python model c=8 req/s over Triton's best (Triton, Python backend, dynamic " \
           "batching) >= 2.500x | 2.320x | 2.154–2.500, met in 1/2 rounds | not met" in body
    assert "| no work | **redline**, `model.py` | JSON | 8,500 (8,000–9,000) |" in body
    assert {t.met for t in found} == {True, False}


def test_a_peer_that_sustains_no_rate_gives_a_lower_bound_not_no_ratio() -> None:
    """Triton's ensemble met the p99 bound at none of the ladder's rates (from 50 req/s) in
    one round: its highest rate is under 50, so redline's 1,000 over 50 is at least 20x."""
    def ladder(top: float, r: int) -> dict:  # type: ignore[type-arg]
        return {"round": r, "max_rate": top, "steps": [{"rate": 50.0}, {"rate": 100.0}]}

    data = {"closed": {"redline_graph": {1: [], 8: []}, "triton_ensemble": {1: [], 8: []}},
            "ladders": {"redline_graph": [ladder(1000, 0), ladder(500, 1)],
                        "triton_ensemble": [ladder(0, 0), ladder(100, 1)]}}
    t = python_compare.Target
    targets = [t("redline_graph", "redline_graph", "graph", "redline", "graph"),
               t("triton_ensemble", "triton_ensemble", "graph", "triton", "ensemble")]
    rate = python_compare.ratios(targets, data)["graph_max_rate_vs_triton"]
    assert rate["lower_bound"] and rate["against"] == "triton_ensemble"
    assert (rate["min"], rate["max"]) == (5.0, 20.0)  # 500/100 measured, 1000/50 at least
    assert rate["ratio"] == pytest.approx(12.5) and rate["rounds_met"] == "2/2"
    assert "triton_ensemble sustained none of the ladder's rates in 1 of 2 rounds" \
        in rate["note"]
    assert "| graph_max_rate_vs_triton | triton_ensemble | ≥ 12.5 |" in python_compare.markdown(
        {"cells": [], "ratios": {"graph_max_rate_vs_triton": rate}})
    found = python_area.targets({"ratios": {"graph_max_rate_vs_triton": rate}})
    assert [x.met for x in found] == [True] and "a lower bound" in found[0].spread
    # neither sustained a rate: still no ratio
    data["ladders"]["redline_graph"] = [ladder(0, 0), ladder(0, 1)]
    data["ladders"]["triton_ensemble"] = [ladder(0, 0), ladder(0, 1)]
    assert python_compare.ratios(targets, data)["graph_max_rate_vs_triton"]["ratio"] is None


@pytest.mark.slow
def test_redline_alone_runs_end_to_end() -> None:
    result = python_compare.main(["--peers", "none", "--workloads", "rowsum", "--rounds", "1",
                                  "--duration", "0.2", "--warmup", "0.1",
                                  "--ladder-duration", "0.2", "--rates", "100"])
    cells = {(c["target"], c["concurrency"]): c for c in result["cells"]}
    assert set(cells) == {(n, c) for n in ("redline", "redline_onnx", "redline_grpc")
                          for c in (1, 8)}
    assert all(c["rps"] > 0 and c["errors"] == 0 for c in cells.values())
    assert result["ratios"]["rowsum_c8_rps_vs_onnx"]["ratio"] > 0


def _state(pid: int, want: str) -> str:
    """The process's state once it is one of ``want`` (a signal lands asynchronously), or
    whatever it is after 5 s."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + 5
    while True:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in want or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def test_each_server_is_measured_alone_and_stopped_even_when_paused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A server's turn pauses every other one (SIGSTOP) and continues its own; stopping the run
    ends them all, the paused ones too."""
    import sys
    import time

    from benchmarks.peers import procs

    run = python_compare.Run(tmp_path)
    run.turns.settle_s = 0.0

    def cmd(name: str) -> list[str]:  # up once its file exists, as a server once ready
        ready = tmp_path / f"{name}.ready"
        return [sys.executable, "-c", "import pathlib, sys, time; "
                "pathlib.Path(sys.argv[1]).touch(); time.sleep(120)", str(ready)]

    a, b = (run.start(name, cmd(name), tmp_path, http=0) for name in ("a", "b"))
    try:
        for name in ("a", "b"):  # a process still exec'ing has no environment to find it by
            deadline = time.monotonic() + 30
            while not (tmp_path / f"{name}.ready").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        run.turn("a")
        assert _state(b.proc.pid, "T") == "T" and _state(a.proc.pid, "RS") in "RS"
        run.turn("b")
        assert _state(a.proc.pid, "T") == "T" and _state(b.proc.pid, "RS") in "RS"
    finally:
        run.stop()
    assert a.proc.poll() is not None and b.proc.poll() is not None
    assert not procs.tagged(a.tag) and not procs.tagged(b.tag)
