"""`make bench` rewrites only what lies between an area's markers, and the same results twice
give the same page."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import run_all
from benchmarks.bench_page import PageError, Target, areas, replace_block

PAGE = """# Performance

Prose a person wrote, kept as it is; it may name a marker, `<!-- bench:offline:start -->`.

<!-- bench:offline:start -->
an old table
<!-- bench:offline:end -->

More prose.

<!-- bench:feature-reads:start -->
<!-- bench:feature-reads:end -->

The end.
"""

OFFLINE_RUNS = [
    {"events": 300000, "labels": 30000, "floor_merge_asof_s": 0.20, "redline_columns_s": 0.18,
     "ratio_vs_floor": 0.9},
    {"events": 300000, "labels": 30000, "floor_merge_asof_s": 0.25, "redline_columns_s": 0.30,
     "ratio_vs_floor": 1.2},
    {"events": 300000, "labels": 30000, "floor_merge_asof_s": 0.22, "redline_columns_s": 0.22,
     "ratio_vs_floor": 1.0},
]


def _read(p50: float, p99: float) -> dict[str, float]:
    return {"p50_us": p50, "p99_us": p99}


READ_RUNS = [
    {"floor_5hmget_x1": _read(100, 200), "redline_redis_computed_x1": _read(150, 300),
     "redline_redis_cached_x1": _read(90, 180), "floor_5hmget_x10": _read(400, 600),
     "redline_redis_computed_x10": _read(700, 900), "redline_redis_cached_x10": _read(200, 300)},
    {"floor_5hmget_x1": _read(110, 250), "redline_redis_computed_x1": _read(160, 600),
     "redline_redis_cached_x1": _read(95, 190), "floor_5hmget_x10": _read(420, 700),
     "redline_redis_computed_x10": _read(720, 1000), "redline_redis_cached_x10": _read(210, 310)},
]


def _args() -> argparse.Namespace:
    return argparse.Namespace(machine="test machine", feast_python=None, rounds=3,
                              ray_python=None, install_peers=False, wanted=[],
                              serving_baseline=None)


def _refresh(page: str) -> tuple[str, run_all.Outcome]:
    args = _args()
    offline = run_all._offline(args, run_all._offline_plan(args), OFFLINE_RUNS)
    reads = run_all._reads(args, run_all._reads_plan(args), READ_RUNS)
    page = replace_block(page, "offline", offline.body)
    return replace_block(page, "feature-reads", reads.body), reads


def test_tables_replace_only_what_lies_between_their_markers() -> None:
    page, _ = _refresh(PAGE)
    assert "an old table" not in page
    outside = [line for line in PAGE.splitlines()
               if not line.startswith("<!-- bench:") and line != "an old table"]
    for line in outside:
        assert line in page.splitlines()
    offline = page.split("<!-- bench:offline:start -->\n")[1].split("<!-- bench:offline:end")[0]
    assert ("| 300,000 / 30,000 | 0.220 (0.200–0.250) s | 0.220 (0.180–0.300) s | "
            "1.000 (0.900–1.200)x |") in offline
    assert areas(page) == ["offline", "feature-reads"]


def test_refreshing_twice_with_the_same_results_changes_nothing() -> None:
    once, _ = _refresh(PAGE)
    twice, _ = _refresh(once)
    # the stamp carries the time to the minute: compare without it
    strip = [line for line in once.splitlines() if not line.startswith("`make bench`")]
    assert strip == [line for line in twice.splitlines() if not line.startswith("`make bench`")]
    assert once.splitlines().count("<!-- bench:offline:start -->") == 1


def test_the_targets_say_met_or_not_and_by_how_much() -> None:
    _, reads = _refresh(PAGE)
    one, ten = reads.targets
    # p99 ratios 1.5x and 2.4x: the median 1.95x meets <= 2 by 0.05
    assert one.met and one.verdict() == "met by 0.050x" and one.spread == "1.500–2.400"
    # ten entities: 900 and 1,000 µs against 500
    assert not ten.met and ten.verdict() == "not met by 450.0 µs"
    assert "| ten entities p99 <= 500.0 µs | 950.0 µs | 900.0–1,000 | not met by 450.0 µs |" in (
        reads.body)


def test_the_command_line_names_no_machine_path() -> None:
    _, reads = _refresh(PAGE)
    stamp = reads.body.splitlines()[0]
    assert "`python -m benchmarks.features.read_bench --calls 600 --pin` (2 rounds)" in stamp
    assert "commit " in stamp and "test machine" in stamp


@pytest.mark.parametrize(("page", "message"), [
    ("no markers at all\n", "no bench:offline markers"),
    ("<!-- bench:offline:start -->\nx\n", "bench:offline:start has no bench:offline:end"),
    ("<!-- bench:offline:end -->\n", "bench:offline:end without its bench:offline:start"),
    ("<!-- bench:offline:start -->\n<!-- bench:offline:end -->\n"
     "<!-- bench:offline:start -->\n<!-- bench:offline:end -->\n", "appears twice"),
    ("<!-- bench:offline:start -->\n<!-- bench:serving:start -->\n", "inside bench:offline"),
])
def test_a_page_with_broken_markers_is_refused_with_what_to_fix(page: str, message: str) -> None:
    with pytest.raises(PageError, match=message):
        replace_block(page, "offline", "table")


def test_a_target_bound_from_above_and_from_below() -> None:
    assert Target("c=8 req/s vs FastAPI", ">=", 1.5, 1.615).verdict() == "met by 0.115x"
    assert Target("c=8 p99 vs FastAPI", "<=", 0.7, 0.738).verdict() == "not met by 0.038x"


def test_an_area_without_its_peer_says_how_to_set_it_up(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REDLINE_PEERS_HOME", str(tmp_path))  # no peer made there
    why = run_all._missing("v1", _args())
    assert "`bash benchmarks/peers/setup.sh feast`" in why and "--install-peers" in why
    assert run_all._missing("offline", _args()) == ""
    args = _args()
    args.install_peers = True  # the run makes the peer first
    assert run_all._missing("v1", args) == ""


def test_the_feast_comparison_reads_its_targets_from_one_result_document() -> None:
    def side(p50: float, p99: float, slices: list[float]) -> dict[str, object]:
        return {"p50_ms": p50, "p99_ms": p99, "slices_p99_ms": slices}

    result = {"open_500": {"redline": side(0.4, 0.8, [0.5, 1.0]),
                           "feast": side(1.0, 6.0, [2.0, 8.0]),
                           "floor": side(0.1, 0.3, [0.2, 0.4])},
              "max_rate_p99_le_5ms": {"redline": 4000.0, "feast": 500.0, "floor": 8000.0}}
    args = _args()
    outcome = run_all._v1(args, run_all._v1_plan(args), [result])
    below, own, rate = outcome.targets
    assert below.met and below.value == pytest.approx(7.5)
    assert below.spread == "4.000–8.000 by slice"
    assert own.met and own.value == pytest.approx(2.0)
    assert rate.met and rate.value == pytest.approx(8.0)
    assert "| FastAPI + Feast + ONNX Runtime | 1.000 | 6.000 | 5.000 (2.000–8.000) | 6.000x |" in (
        outcome.body)


def _ray_side(c1: float, ladder: list[tuple[int, float]], bound: float = 20.0) -> dict:
    steps = [{"rate": rate, "p50_ms": p99 / 2, "p99_ms": p99, "errors": 0} for rate, p99 in ladder]
    side: dict = {"c1": {"rps": c1, "p50_ms": 2.0, "p99_ms": 5.0},
                  "c8": {"rps": 2 * c1, "p50_ms": 8.0, "p99_ms": 30.0}, "ladder": steps}
    ok = [s["rate"] for s in steps if s["p99_ms"] <= bound]
    if ok:
        side["max_rate_p99_ok"] = max(ok)
    return side


def test_the_ray_comparison_judges_redline_against_the_best_peer_configuration() -> None:
    from benchmarks.recommend.compare_ray_serve import summarize

    peers = {"one:haproxy": {"ray-serve one:haproxy": _ray_side(90, [(5, 15.0), (10, 19.0),
                                                                    (20, 40.0)]),
                             "redline": _ray_side(500, [(5, 6.0), (10, 7.0), (20, 8.0), (40, 9.0),
                                                        (80, 12.0), (150, 30.0)])},
             "three:haproxy:8": {"ray-serve three:haproxy:8": _ray_side(60, [(5, 25.0)]),
                                 "redline": _ray_side(520, [(5, 6.0), (10, 30.0)])}}
    summary = summarize(peers)
    assert summary["best_peer"] == "one:haproxy" and summary["peer_max_rate"] == 10
    assert summary["rate_ratio"] == 8.0 and summary["p99_lower_at_every_sustained_rate"]
    args = _args()
    args.ray_python = "/scratch/redline-ray-serve/venv/bin/python"
    outcome = run_all._ray(args, run_all._ray_plan(args),
                           [{"p99_bound_ms": 20.0, "peers": peers, "summary": summary}])
    c8, rate, c1_p50, slower = outcome.targets
    assert c8.met and c8.value == pytest.approx(1000 / 180)
    assert rate.met and rate.value == 8.0 and slower.met
    assert c1_p50.met and c1_p50.value == pytest.approx(1.0)  # 2.0 ms each: "no higher"
    assert ("| ray-serve three:haproxy:8 | 60 | 2.0 / 5.0 | 120 | 8.0 / 30.0 | "
            "none (25.0 ms at 5) |") in outcome.body
    stamp = outcome.body.splitlines()[0]
    assert "--peer-python $RAY_PYTHON" in stamp and "/scratch" not in stamp

    peers["one:haproxy"]["redline"]["ladder"][1]["p99_ms"] = 19.5  # slower than the peer at 10/s
    assert not summarize(peers)["p99_lower_at_every_sustained_rate"]


def test_the_ray_sentence_says_when_a_mode_sustained_no_rate() -> None:
    peers = {"one:proxy": {"ray-serve one:proxy": _ray_side(110, [(5, 21.3)])},
             "one:haproxy": {"ray-serve one:haproxy": _ray_side(300, [(5, 3.0), (10, 4.0)])}}
    text = run_all.ray_modes(peers, "one:haproxy", 20.0)
    assert "one:proxy: no rate with p99 ≤ 20 ms, 110 req/s at c=1" in text
    assert "one:haproxy: 10 req/s with p99 ≤ 20 ms, 300 req/s at c=1" in text


def test_the_serving_table_shows_today_against_a_baseline_commit() -> None:
    def cell(server: str, proto: str, c: int, rps: float) -> dict[str, object]:
        return {"server": server, "protocol": proto, "concurrency": c, "rps": rps,
                "rps_min": rps, "rps_max": rps, "p50_ms": 0.2, "p99_ms": 0.5,
                "p99_ms_min": 0.5, "p99_ms_max": 0.5, "server_cpu_us_per_req": 40.0}

    result = {"cells": [cell("redline", "json", 8, 5000), cell("baseline", "json", 8, 4000)],
              "ratios": {}, "baseline": {"ref": "6c87ffb^", "ratios": {
                  "json_c8_rps_vs_baseline": {"ratio": 1.25, "min": 1.1, "max": 1.3}}}}
    args = _args()
    args.serving_baseline = "6c87ffb^"
    plan = run_all._serving_plan(args)
    assert plan[plan.index("--baseline") + 1] == "6c87ffb^"
    body = run_all._serving(args, plan, [result]).body
    assert "at commit `6c87ffb^`" in body
    assert "| json | — | 1.250 (1.100–1.300) | — | — | — | — |" in body
    assert "| **redline** | json | 8 |" in body and "baseline commit | json" not in body
