"""Run every comparison that needs no extra setup and rewrite docs/performance.md's tables.

    make bench                                   # or: python benchmarks/run_all.py
    python benchmarks/run_all.py --areas serving,offline --dry-run

Each area runs its benchmark (the benchmarks interleave redline with its floor or peer
themselves), renders one table with the command, date, commit and machine, and the spread over
rounds, and replaces the text between ``<!-- bench:AREA:start -->`` and ``<!-- bench:AREA:end
-->`` in the page. The summary printed at the end is the same tables, then one line per target:
met or not, and by how much. The peers (MLServer, Feast, Ray Serve) run from environments of
their own (``benchmarks/peers/``): an area whose peer is not made yet says how to make it and
leaves its table as it was, unless ``--install-peers`` makes it first. Each run keeps its results
in a work folder of its own, removed at exit, so two runs at once never mix them.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, the repository root may not be on the path
from benchmarks.bench_page import (  # noqa: E402
    Target,
    number,
    replace_block,
    spread,
    table,
    targets_table,
)
from benchmarks.models import cascade_area, python_area  # noqa: E402
from benchmarks.peers import envs  # noqa: E402

PAGE = ROOT / "docs" / "performance.md"
PY = sys.executable
DEFAULT_AREAS = ("serving", "feature-reads", "ingest", "offline", "monitoring")
PEER_AREAS = ("mlserver", "v1", "feast-offline")
# The peer environments (benchmarks/peers/envs.py) an area runs.
AREA_PEERS: dict[str, str | tuple[str, ...]] = {
    "mlserver": "mlserver", "v1": "feast", "feast-offline": "feast", "recommend-ray": "ray-serve",
    "python-peers": python_area.PEERS}
# The Ray Serve configurations: its default mode and its throughput-optimized one, each with
# and without @serve.batch on retrieval and ranking (benchmarks/recommend/ray_serve_app.py).
RAY_PEERS = ("one:proxy", "one:proxy:8", "one:haproxy", "one:haproxy:8")


@dataclass
class Outcome:
    """What an area produced: the page's block and its targets, or why it did not run."""

    area: str
    body: str = ""
    targets: list[Target] = field(default_factory=list)
    skipped: str = ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--areas", default=",".join((*DEFAULT_AREAS, *PEER_AREAS)),
                    help="comma-separated areas (default: " + ", ".join(
                        (*DEFAULT_AREAS, *PEER_AREAS)) + "; the last three run peers from their "
                    "own environments, benchmarks/peers/setup.sh makes them); also: hedging "
                    "(three minutes), graph (the inference-graph steps, two minutes), "
                    "recommend-ray (the recommender against Ray Serve, fifteen minutes), "
                    "python-peers (Python models and a three-step graph against Triton, MLServer "
                    "and Ray Serve, fifteen minutes), cascade (examples/textclf's cascade "
                    "against its MLP alone, five minutes)")
    ap.add_argument("--install-peers", action="store_true",
                    help="make the peer environments the areas need when they are missing "
                    "(what `bash benchmarks/peers/setup.sh` does; minutes each)")
    ap.add_argument("--feast-python", type=Path, default=None,
                    help="the Feast peer's interpreter (default: benchmarks/peers' feast)")
    ap.add_argument("--ray-python", type=Path, default=_env_path("RAY_SERVE_PYTHON"),
                    help="the Ray Serve peer's interpreter (default: benchmarks/peers' "
                    "ray-serve; env RAY_SERVE_PYTHON)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per area (default 3)")
    ap.add_argument("--serving-baseline", metavar="REF", default=None,
                    help="serving: also serve redline as of this git commit in the same rounds, "
                    "and add today's against it to the table (how a hot-path change is checked)")
    ap.add_argument("--page", type=Path, default=PAGE)
    ap.add_argument("--machine", default="shared 2-core VM, noisy: read the ratios",
                    help="how the page's tables describe the machine")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    ap.add_argument("--no-write", action="store_true", help="print the tables, leave the page")
    args = ap.parse_args(argv)
    wanted = [a.strip() for a in args.areas.split(",") if a.strip()]
    unknown = [a for a in wanted if a not in AREAS]
    if unknown:
        ap.error(f"unknown area(s) {', '.join(unknown)}: choose from {', '.join(AREAS)}")
    args.wanted = wanted
    if args.dry_run:
        for area in wanted:
            why = _missing(area, args)
            print(f"{area}: {'skipped. ' + why if why else _shown(AREAS[area][0](args), args)}")
        return 0
    outcomes: list[Outcome] = []
    for area in wanted:
        plan, render = AREAS[area]
        command = plan(args)
        why = _missing(area, args)
        if not why and args.install_peers and area in AREA_PEERS:
            for peer in _peers_of(area):
                envs.ensure(peer)
        if why:
            outcomes.append(Outcome(area, skipped=why))
            print(f"== {area}: skipped. {why}", flush=True)
            continue
        print(f"== {area}: {_shown(command, args)}", flush=True)
        started = time.monotonic()
        try:
            outcome = render(args, command, _collect(area, args, command))
        except (subprocess.CalledProcessError, KeyError, ValueError) as exc:
            outcome = Outcome(area, skipped=f"the run failed ({exc}); its table is unchanged")
        outcome.area = area
        outcomes.append(outcome)
        print(f"   {time.monotonic() - started:.0f} s", flush=True)
    _report(outcomes)
    if not args.no_write:
        page = args.page.read_text()
        for outcome in outcomes:
            if outcome.body:
                page = replace_block(page, outcome.area, outcome.body)
        args.page.write_text(page)
    return 0


# --------------------------------------------------------------------------- the areas
def _serving_plan(args: argparse.Namespace) -> list[str]:
    cmd = [PY, "benchmarks/serving/compare.py", "--rounds", str(args.rounds), "--duration",
           "1.5", "--warmup", "0.5", "--out", str(_scratch("serving.json"))]
    if "mlserver" in args.wanted and not _missing("mlserver", args):
        cmd.append("--mlserver")
    if args.serving_baseline:
        cmd += ["--baseline", args.serving_baseline]
    return cmd


def _serving(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    result = runs[0]
    targets = []
    for key, entry in result["ratios"].items():
        if "target" in entry:
            op, bound = entry["target"].split(" ", 1)
            targets.append(Target(_RATIO_NAMES.get(key, key), op, float(bound), entry["ratio"],
                                  spread=f"{number(entry['min'])}–{number(entry['max'])}"))
    rows = [[_SERVER_NAMES.get(c["server"], c["server"]), c["protocol"], str(c["concurrency"]),
             f"{c['rps']:,.0f} ({c['rps_min']:,.0f}–{c['rps_max']:,.0f})", number(c["p50_ms"]),
             f"{number(c['p99_ms'])} ({number(c['p99_ms_min'])}–{number(c['p99_ms_max'])})",
             # nginx answers from worker processes the master's CPU time does not count
             "—" if c["server"] == "nginx" else number(c["server_cpu_us_per_req"])]
            for c in sorted(result["cells"], key=_cell_order)
            if c["server"] not in ("mlserver", "baseline")]  # the baseline: as ratios below
    lines = [_stamp(args, command), "", *targets_table(targets), "",
             *table(["server", "protocol", "c", "req/s (min–max)", "p50 ms", "p99 ms (min–max)",
                     "server CPU µs/req"], rows)]
    base = result.get("baseline")
    if base:
        ratios = base["ratios"]
        rows = [[proto, *(f"{number(e['ratio'])} ({number(e['min'])}–{number(e['max'])})"
                          if e else "—"
                          for e in (ratios.get(f"{proto}_c{c}_{m}_vs_baseline")
                                    for m in ("rps", "p99") for c in (1, 8, 32)))]
                for proto in ("json", "binary", "grpc")]
        lines += ["", f"Today's redline over itself at commit `{base['ref']}`, served in the "
                  "same rounds (the medians' ratio, min–max over the rounds; req/s over 1 and "
                  "p99 under 1 are today's gains):", "",
                  *table(["protocol", "req/s c=1", "c=8", "c=32", "p99 c=1", "c=8", "c=32"],
                         rows)]
    return Outcome("serving", "\n".join(lines), targets)


def _mlserver(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    """MLServer rides in the serving run (``--mlserver``); this renders its rows."""
    result = runs[0]
    cells = {(c["server"], c["protocol"], c["concurrency"]): c for c in result["cells"]}
    rows = []
    for server in ("mlserver", "fastapi", "raw_asgi", "redline"):
        row = [_SERVER_NAMES.get(server, server)]
        for c in (1, 8, 32):
            cell = cells.get((server, "json", c))
            row.append(f"{cell['rps']:,.0f}, {number(cell['p50_ms'])} / {number(cell['p99_ms'])}"
                       if cell else "—")
        rows.append(row)
    lines = [_stamp(args, command), "", *table(
        ["server (REST JSON)", "c=1 req/s, p50 / p99 ms", "c=8 req/s, p50 / p99 ms",
         "c=32 req/s, p50 / p99 ms"], rows)]
    return Outcome("mlserver", "\n".join(lines))


def _reads_plan(args: argparse.Namespace) -> list[str]:
    return [PY, "-m", "benchmarks.features.read_bench", "--calls", "600", "--pin"]


def _reads(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    cases = [("floor: 5 HMGETs, one entity", "floor_5hmget_x1", "floor_5hmget_x1"),
             ("redline on Redis, computed, one entity", "redline_redis_computed_x1",
              "floor_5hmget_x1"),
             ("redline on Redis, cached, one entity", "redline_redis_cached_x1",
              "floor_5hmget_x1"),
             ("floor: 50 HMGETs, ten entities", "floor_5hmget_x10", "floor_5hmget_x10"),
             ("redline on Redis, computed, ten entities", "redline_redis_computed_x10",
              "floor_5hmget_x10"),
             ("redline on Redis, cached, ten entities", "redline_redis_cached_x10",
              "floor_5hmget_x10")]
    rows = []
    for label, key, floor in cases:
        p99 = [r[key]["p99_us"] for r in runs]
        vs = [r[key]["p99_us"] / r[floor]["p99_us"] for r in runs]
        rows.append([label, spread([r[key]["p50_us"] for r in runs]), spread(p99),
                     spread(vs) + "x"])
    one = [r["redline_redis_computed_x1"]["p99_us"] / r["floor_5hmget_x1"]["p99_us"]
           for r in runs]
    ten = [r["redline_redis_computed_x10"]["p99_us"] for r in runs]
    targets = [Target("one entity p99 vs the floor", "<=", 2.0, statistics.median(one),
                      spread=_range(one)),
                   Target("ten entities p99", "<=", 500.0, statistics.median(ten), unit=" µs",
                          spread=_range(ten))]
    lines = [_stamp(args, command, rounds=len(runs)), "",
             *table(["read, µs (median, min–max over rounds)", "p50", "p99", "p99 vs the floor"],
                    rows), "", *targets_table(targets)]
    return Outcome("feature-reads", "\n".join(lines), targets)


def _ingest_plan(args: argparse.Namespace) -> list[str]:
    return [PY, "-m", "benchmarks.features.ingest_bench", "--events", "20000", "--no-freshness"]


def _ingest(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    rows, targets = [], []
    for name, label, bound in (("1_view_6_features", "1 view", 50_000.0),
                               ("5_views_40_features", "5 views / 40 features", 30_000.0)):
        floor = [r[f"floor_redis_pipeline_{name}"]["events_per_s"] for r in runs]
        rate = [r[f"throughput_{name}"]["events_per_s"] for r in runs]
        ups = runs[0][f"throughput_{name}"]["tile_updates_per_event"]
        rows.append([f"floor: `HSET` pipeline, {ups} updates an event ({label})", spread(floor),
                     "1.00x"])
        rows.append([f"redline, Redis Streams, {label}, 1 process", spread(rate),
                     spread([r[f"throughput_{name}"]["vs_floor"] for r in runs]) + "x"])
        targets.append(Target(f"ingest, {label}, one process", ">=", bound,
                              statistics.median(rate), unit=" ev/s", spread=_range(rate)))
    kinesis = [r for r in runs if "throughput_kinesis_1_view_6_features" in r]
    if kinesis:  # kinesalite installed (tools/services.d): Kinesis beside its own floor
        floor = [r["floor_kinesis_get_records_decode"]["events_per_s"] for r in kinesis]
        rows.append(["floor: boto3 `GetRecords` + orjson decode, kinesalite, 4 shards",
                     spread(floor), "—"])
        rows.append(["redline, Kinesis (kinesalite), 1 view, 1 process",
                     spread([r["throughput_kinesis_1_view_6_features"]["events_per_s"]
                             for r in kinesis]),
                     spread([r["throughput_kinesis_1_view_6_features"]["vs_floor"]
                             for r in kinesis]) + "x of its floor"])
    lines = [_stamp(args, command, rounds=len(runs)), "",
             *table(["case (median, min–max over rounds)", "events/s", "vs the raw `HSET` floor"],
                    rows), "", *targets_table(targets)]
    return Outcome("ingest", "\n".join(lines), targets)


def _offline_plan(args: argparse.Namespace) -> list[str]:
    return [PY, "-m", "benchmarks.features.offline_bench", "--events", "300000", "--labels",
            "30000", "--entities", "3000"]


def _offline(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    first = runs[0]
    rows = [[f"{first['events']:,} / {first['labels']:,}",
             spread([r["floor_merge_asof_s"] for r in runs]) + " s",
             spread([r["redline_columns_s"] for r in runs]) + " s",
             spread([r["ratio_vs_floor"] for r in runs]) + "x"]]
    lines = [_stamp(args, command, rounds=len(runs)), "",
             *table(["events / labels", "`merge_asof` floor (median, min–max)", "redline",
                     "redline vs floor"], rows)]
    return Outcome("offline", "\n".join(lines))


def _monitoring_plan(args: argparse.Namespace) -> list[str]:
    return [PY, "benchmarks/observability/capacity.py", "--rounds", "8", "--seconds", "3",
            "--otlp", "--traces-100"]


MONITORED = (("v1", "`/v1` (fraud, features)"), ("v2", "V2 REST (breast_cancer)"))


def _monitoring(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    """One row per API and run of the capacity benchmark; each target's value is the median of
    the runs' medians, so it is met exactly when most runs meet it (two of three)."""
    rows, targets = [], []
    for api, label in MONITORED:
        cpu, rate = [], []
        for n, run in enumerate(runs, 1):
            entry = run["apis"].get(api)
            if not entry:
                continue
            off, on, full = entry["off"], entry["on"], entry.get("traces_100")
            cpu.append(on["cpu_ratio"]["median"])
            rate.append(on["rate_ratio"]["median"])
            rows.append([label, str(n), f"{off['rps']:,.0f} → {on['rps']:,.0f}",
                         _ratio(on["rate_ratio"]), f"{number(off['cpu_us'])} → "
                         f"{number(on['cpu_us'])}", _ratio(on["cpu_ratio"]),
                         _ratio(full["rate_ratio"]) if full else "—",
                         _ratio(full["cpu_ratio"]) if full else "—"])
        if cpu:
            targets += [Target(f"{label} CPU per request, on/off", "<=", 1.05,
                               statistics.median(cpu), spread=_range(cpu)),
                        Target(f"{label} throughput, on/off", ">=", 0.95,
                               statistics.median(rate), spread=_range(rate))]
    rounds = runs[0]["rounds"] if runs else 0
    lines = [_stamp(args, command), "",
             f"{len(runs)} runs of {rounds} rounds; a round drives each server alone for "
             f"{runs[0]['seconds'] if runs else 0:g} s per API, in rotating order; "
             "ratios are against \"off\" in the same round (median, min–max of the rounds).", "",
             *table(["API", "run", "req/s, off → on", "throughput on/off",
                     "server CPU µs/req, off → on", "CPU per request on/off",
                     "traces at 100%: throughput on/off", "traces at 100%: CPU on/off"], rows), "",
             "Each target's value is the median of the runs' medians (min–max over the runs): "
             "it is met exactly when most runs meet it.", "",
             *targets_table(targets)]
    return Outcome("monitoring", "\n".join(lines), targets)


def _ratio(summary: dict) -> str:  # type: ignore[type-arg]
    """A ratio's median and range over rounds, as the page prints it."""
    return (f"{number(summary['median'])} "
            f"({number(summary['min'])}–{number(summary['max'])})")


def _v1_plan(args: argparse.Namespace) -> list[str]:
    return [PY, "benchmarks/pipeline/feast_compare.py", *_given("--feast-python",
                                                               args.feast_python),
            "--cases", "open_500,ladder", "--rounds", "10", "--duration", "30"]


def _v1(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    out = runs[0]
    sides = out["open_500"]
    names = {"redline": "redline", "feast": "FastAPI + Feast + ONNX Runtime",
             "floor": "do-nothing floor"}
    rows = [[names.get(label, label), number(s["p50_ms"]), number(s["p99_ms"]),
             spread(s.get("slices_p99_ms") or [s["p99_ms"]]),
             number(s["p99_ms"] / s["p50_ms"]) + "x"] for label, s in sides.items()]
    red, feast = sides["redline"], sides["feast"]
    paired = [f / r for f, r in zip(feast.get("slices_p99_ms", []),
                                    red.get("slices_p99_ms", []), strict=False) if r]
    targets = [Target("Feast's p99 over redline's at 500 req/s", ">=", 4.0,
                      feast["p99_ms"] / red["p99_ms"],
                      spread=_range(paired) + " by slice" if paired else ""),
               Target("redline p99 over its own p50", "<=", 3.0, red["p99_ms"] / red["p50_ms"])]
    top = out.get("max_rate_p99_le_5ms", {})
    if top.get("feast"):
        targets.append(Target("highest rate with p99 ≤ 5 ms, redline over Feast", ">=", 5.0,
                              top["redline"] / top["feast"]))
    lines = [_stamp(args, command, rounds=10), "",
             *table(["500 req/s open loop", "p50 ms", "p99 ms (pooled)",
                     "p99 of the slices (median, min–max)", "p99 / own p50"], rows), "",
             *targets_table(targets)]
    return Outcome("v1", "\n".join(lines), targets)


def _feast_offline_plan(args: argparse.Namespace) -> list[str]:
    return [PY, "-m", "benchmarks.features.feast_training_set",
            *_given("--feast-python", args.feast_python), "--labels", "100000,1000000",
            "--repeat", "3", "--out", str(_scratch("feast_offline.json"))]


def _feast_offline(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    rows, targets = [], []
    for r in runs[0]:
        n = f"{r['labels']:,}"
        rows.append([n, f"{number(r['feast_s'])} ({number(r['feast_median_s'])}) s",
                     f"{number(r['redline_s'])} ({number(r['redline_median_s'])}) s",
                     f"{number(r['speedup'])}x ({number(r['speedup_median'])}x)",
                     f"{r['feast_rows']:,} / {r['redline_rows']:,} "
                     f"({r['redline_rows_with_every_value']:,})",
                     f"{r['compared_values']:,}", f"{r['differences']:,}"])
        pairs = [f / red for f, red in zip(r["feast_runs_s"], r["redline_runs_s"], strict=True)]
        targets += [Target(f"redline over Feast, {n} label rows", ">=",
                           10.0, r["speedup_median"],
                           spread=f"{number(min(pairs))}–{number(max(pairs))}x"),
                    Target(f"values that differ, {n} label rows", "<=", 0.0,
                           float(r["differences"]), unit="")]
    clocks = ("each clock: the 5 feature Parquet files to a pandas frame, the label frame read "
              "before it; the sides take turns, each timed build right after an untimed one of "
              "its own (the script's docstring says why)")
    lines = [f"{_stamp(args, command)} · {clocks}", "",
             *table(["label rows", "Feast, best (median)", "redline, best (median)",
                     "redline vs Feast, best (median)",
                     "rows returned: Feast / redline (every value set)", "values compared",
                     "differences"], rows), "", *targets_table(targets)]
    return Outcome("feast-offline", "\n".join(lines), targets)


def _ray_plan(args: argparse.Namespace) -> list[str]:
    """Every Ray Serve configuration, with as many replicas as redline has workers (one per
    core, redline's default)."""
    peers = [part for config in RAY_PEERS for part in ("--peer", config)]
    return [PY, "benchmarks/recommend/compare_ray_serve.py", "--artifacts",
            "examples/recommend/artifacts", "--data", "examples/recommend/data",
            *_given("--peer-python", args.ray_python), *peers, "--workers",
            str(os.cpu_count() or 1), "--rounds", "2", "--duration", "4", "--json-out",
            str(_scratch("ray.json"))]


def _ray(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    report = runs[0]
    bound = report["p99_bound_ms"]
    peers = report["peers"]
    rows = [_ray_row(name if name != "redline" else f"redline (in turns with {config})", r)
            + [ray_mode(config) if name != "redline" else ""]
            for config, targets in peers.items() for name, r in targets.items()]
    s = report["summary"]
    best = s["best_peer"]
    ratio = s["rate_ratio"] if s["rate_ratio"] is not None else float(s["redline_max_rate"])
    peer = f"Ray Serve {best}"
    not_lower = s.get("p99_not_lower_at_rates")
    targets = [Target(f"c=8 throughput, redline over {peer}", ">=", 3.0, s["c8_rps_ratio"]),
               Target(f"highest rate with p99 ≤ {bound:.0f} ms, redline over {peer}"
                      + ("" if s["peer_max_rate"] else
                         " (the peer sustained none: redline's rate)"), ">=", 3.0, ratio),
               Target(f"c=1 p50, redline over {peer}", "<=", 1.0,
                      s.get("c1_p50_ratio", peers[best]["redline"]["c1"]["p50_ms"]
                            / peers[best][f"ray-serve {best}"]["c1"]["p50_ms"])),
               Target(f"rates {peer} sustained ({s.get('peer_sustained_rates', '?')}) where "
                      "redline's p99 was not lower", "<=", 0.0,
                      float(len(not_lower)) if not_lower is not None else
                      0.0 if s["p99_lower_at_every_sustained_rate"] else 1.0, unit="")]
    lead = ray_lead(best, _ray_row(f"ray-serve {best}", peers[best][f"ray-serve {best}"]),
                    _ray_row("redline", peers[best]["redline"]), bound)
    lines = [_stamp(args, command), "", lead, "", ray_modes(peers, best, bound), "",
             *table(RAY_HEADER[:-1] + [RAY_HEADER[-1].format(bound=bound), "Ray Serve mode"],
                    rows), "", *targets_table(targets)]
    return Outcome("recommend-ray", "\n".join(lines), targets)


RAY_HEADER = ["target", "c=1 req/s", "c=1 p50 / p99 ms", "c=8 req/s", "c=8 p50 / p99 ms",
              "highest rate with p99 ≤ {bound:.0f} ms"]


def _ray_row(name: str, r: dict) -> list[str]:  # type: ignore[type-arg]
    """One target's row of the Ray Serve table, as the page prints it."""
    top = r.get("max_rate_p99_ok")
    if top is None:
        first = r["ladder"][0]
        shown = f"none ({number(first['p99_ms'])} ms at {first['rate']})"
    else:
        shown = str(top)
    return [name, f"{r['c1']['rps']:.0f}", f"{r['c1']['p50_ms']:.1f} / {r['c1']['p99_ms']:.1f}",
            f"{r['c8']['rps']:.0f}", f"{r['c8']['p50_ms']:.1f} / {r['c8']['p99_ms']:.1f}", shown]


def ray_mode(config: str) -> str:
    """Which of Ray Serve's modes a configuration (``LAYOUT:INGRESS[:BATCH]``) runs."""
    parts = config.split(":")
    mode = "throughput-optimized, HAProxy" if parts[1] == "haproxy" else "default, Python proxy"
    batch = f", @serve.batch {parts[2]}" if len(parts) > 2 and int(parts[2]) > 1 else ""
    return mode + batch


def ray_modes(peers: dict, best: str, bound: float) -> str:  # type: ignore[type-arg]
    """The sentence that names Ray Serve's best configuration in each mode, and its best."""
    def key(config: str) -> tuple[int, float]:
        r = peers[config][f"ray-serve {config}"]
        return int(r.get("max_rate_p99_ok") or 0), float(r["c1"]["rps"])

    parts = []
    for ingress, mode in (("proxy", "default mode (Python proxy)"),
                          ("haproxy", "throughput-optimized mode (HAProxy)")):
        configs = [c for c in peers if c.split(":")[1] == ingress]
        if configs:
            top = max(configs, key=key)
            rate, c1 = key(top)
            sustained = (f"{rate} req/s with p99 ≤ {bound:.0f} ms" if rate
                         else f"no rate with p99 ≤ {bound:.0f} ms")
            parts.append(f"in its {mode}, {top}: {sustained}, {c1:.0f} req/s at c=1")
    return (f"Ray Serve at its best {'; '.join(parts)}. The peer's best, which the targets "
            f"are measured against: {best} ({ray_mode(best)}).")


def ray_lead(config: str, peer_row: list[str], our_row: list[str], bound: float) -> str:
    """The sentence above the Ray Serve table, made from two of its rows (the best peer
    configuration's and redline's beside it): every ratio is of two figures the table prints,
    so prose and table cannot disagree."""
    def rate(cell: str) -> int:
        return int(cell) if cell.isdigit() else 0

    ours, theirs = rate(our_row[5]), rate(peer_row[5])
    c1, c8 = (float(our_row[i]) / float(peer_row[i]) for i in (1, 3))
    top = (f"{ours / theirs:.1f}x its highest rate with p99 ≤ {bound:.0f} ms ({ours} against "
           f"{theirs} req/s)" if theirs else
           f"{ours} req/s with p99 ≤ {bound:.0f} ms, where the peer sustained no rate")
    return (f"Against Ray Serve's best configuration in this run ({config}), redline reached "
            f"{top}, {c1:.1f}x its throughput at c=1 and {c8:.1f}x at c=8.")


Render = Callable[[argparse.Namespace, list[str], list[dict]], Outcome]  # type: ignore[type-arg]
def _hedging_plan(args: argparse.Namespace) -> list[str]:
    return [PY, "benchmarks/scaling/hedging.py", "--calls", "3000", "--rounds", str(args.rounds),
            "--json-out", str(_scratch("hedging.json"))]


def _hedging(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    result = runs[0]
    names = {"floor": "floor: no stragglers, no hedging", "no_hedge": "stragglers, no hedging",
             "hedge": "stragglers, hedged after the p95"}
    rows = [[label, *(f"{number(result[key][m])} ms" for m in ("p50_ms", "p99_ms", "p999_ms",
                                                              "max_ms")),
             f"{result[key]['extra_requests_share']:.1%}"] for key, label in names.items()]
    targets = [Target("p99.9 without hedging over hedged", ">=", 10.0, result["p999_ratio"]),
               Target("extra requests", "<=", 5.0,
                      100 * result["hedge"]["extra_requests_share"], unit=" %")]
    lines = [_stamp(args, command, rounds=result["rounds"]), "",
             *table(["client (pooled over the rounds)", "p50", "p99", "p99.9", "max",
                     "extra requests"], rows), "", *targets_table(targets)]
    return Outcome("hedging", "\n".join(lines), targets)


def _graph_plan(args: argparse.Namespace) -> list[str]:
    return [PY, "-m", "benchmarks.pipeline.graph_steps", "--cpu", "--requests", "1000",
            "--json-out", str(_scratch("graph.json"))]


def _graph(args: argparse.Namespace, command: list[str], runs: list[dict]) -> Outcome:
    r = runs[0]
    labels = {"query": "query (mean of the session items' embeddings)",
              "retrieve exact": "retrieve, exact (numpy, one thread)",
              "retrieve hnsw": f"retrieve, HNSW (FAISS, M={r['hnsw_m']}, efSearch "
                               f"{r['ef_search']})",
              "rank rows": "rank rows (100 candidates x 7 columns)",
              "ranker run (K rows)": "ranker run (100 rows, 100 trees)",
              "rank order": "rank order", "rules": "rules (seen, out of stock, top 10)"}
    rows = [[label, f"{r['steps_us'][key][0]:.0f}", f"{r['steps_us'][key][1]:.0f}"]
            for key, label in labels.items()]
    rows.append(["all steps, HNSW retrieval", f"{r['total_us'][0]:.0f}",
                 f"{r['total_us'][1]:.0f}"])
    lines = [_stamp(args, command), "",
             *table([f"step ({r['clock']} time)", "p50 µs", "p99 µs"], rows), "",
             f"`models add` of this graph: {r['add_s']:.0f} s to build the HNSW index; "
             f"recall@{r['k']} against exact search {r['recall']:.3f} at efSearch "
             f"{r['ef_search']} on these random (structureless) embeddings."]
    return Outcome("graph", "\n".join(lines), [])


def _module_area(area: str, module: ModuleType) -> tuple[Callable[[argparse.Namespace], list[str]],
                                                  Render]:
    """An area whose module says its command (``plan``), result file (``RESULT``) and block
    (``render``): ``python_area``, ``cascade_area``."""
    def plan(args: argparse.Namespace) -> list[str]:
        return module.plan(PY, args.rounds, _scratch(module.RESULT))  # type: ignore[no-any-return]

    def render(args: argparse.Namespace, command: list[str],
               runs: list[dict]) -> Outcome:  # type: ignore[type-arg]
        body, targets = module.render(_stamp(args, command), runs[0])
        return Outcome(area, body, targets)

    return plan, render


AREAS: dict[str, tuple[Callable[[argparse.Namespace], list[str]], Render]] = {
    "serving": (_serving_plan, _serving),
    "feature-reads": (_reads_plan, _reads),
    "ingest": (_ingest_plan, _ingest),
    "offline": (_offline_plan, _offline),
    "monitoring": (_monitoring_plan, _monitoring),
    "mlserver": (_serving_plan, _mlserver),
    "v1": (_v1_plan, _v1),
    "hedging": (_hedging_plan, _hedging),
    "graph": (_graph_plan, _graph),
    "feast-offline": (_feast_offline_plan, _feast_offline),
    "recommend-ray": (_ray_plan, _ray),
    "python-peers": _module_area("python-peers", python_area),
    "cascade": _module_area("cascade", cascade_area),
}

_RATIO_NAMES = {
    "rest_json_c1_p50_vs_nginx": "REST JSON c=1 p50 vs nginx",
    "rest_json_c1_p99_vs_nginx": "REST JSON c=1 p99 vs nginx",
    "rest_json_c8_rps_vs_fastapi": "REST JSON c=8 req/s vs FastAPI",
    "rest_json_c8_rps_vs_raw_asgi": "REST JSON c=8 req/s vs bare ASGI",
    "rest_json_c8_p99_vs_fastapi": "REST JSON c=8 p99 vs FastAPI",
    "mlp_c32_rps_vs_fastapi": "MLP c=32 req/s vs FastAPI",
    "grpc_c8_rps_vs_raw_grpc": "gRPC c=8 req/s vs bare grpc.aio",
}
_ORDER = [("nginx", "json"), ("raw_asgi", "json"), ("fastapi", "json"), ("redline", "json"),
          ("redline", "binary"), ("raw_grpc", "grpc"), ("redline", "grpc"),
          ("fastapi_mlp", "json"), ("redline_mlp", "json")]


def _cell_order(cell: dict) -> tuple[int, int]:  # type: ignore[type-arg]
    """Concurrency first, then each floor before the redline row it is compared with."""
    key = (cell["server"], cell["protocol"])
    return cell["concurrency"], _ORDER.index(key) if key in _ORDER else len(_ORDER)


_SERVER_NAMES = {
    "nginx": "nginx (canned answer)", "raw_asgi": "bare ASGI + ONNX Runtime",
    "fastapi": "FastAPI + ONNX Runtime", "raw_grpc": "bare grpc.aio + ONNX Runtime",
    "redline": "**redline**", "fastapi_mlp": "FastAPI + ONNX Runtime, MLP 3x1024",
    "redline_mlp": "**redline**, MLP 3x1024", "mlserver": "MLServer",
    "baseline": "redline at the baseline commit",
}


# Areas whose benchmark interleaves its own rounds and writes its result to a file.
_RESULT_FILES = {"serving": "serving.json", "mlserver": "serving.json",
                 "hedging": "hedging.json",
                 "graph": "graph.json", "feast-offline": "feast_offline.json",
                 "recommend-ray": "ray.json", "python-peers": python_area.RESULT,
                 "cascade": cascade_area.RESULT}


# --------------------------------------------------------------------------- helpers
def _collect(area: str, args: argparse.Namespace, command: list[str]) -> list[dict]:  # type: ignore[type-arg]
    """The benchmark's results: one JSON document per round (the serving and Feast benchmarks
    run their rounds themselves and give one; monitoring's capacity benchmark gives one per
    whole run)."""
    if area == "monitoring":  # whole runs of the capacity benchmark, a result file each
        runs = []
        for n in range(args.rounds):
            path = _scratch(f"monitoring-{n}.json")
            _run([*command, "--json-out", str(path)], show=True)
            runs.append(json.loads(path.read_text()))
        return runs
    name = _RESULT_FILES.get(area)
    if name:
        path = _scratch(name)
        if not path.exists():  # MLServer's rows come from the serving run
            _run(command, show=True)
        return [json.loads(path.read_text())]
    if area == "v1":
        return [json.loads(_run(command))]
    return [json.loads(_run(command)) for _ in range(args.rounds)]


def _missing(area: str, args: argparse.Namespace) -> str:
    """Why an area cannot run here, with what to do; empty when it can."""
    if area == "monitoring" and not (ROOT / ".redline" / "demo" / "redline.yaml").is_file():
        return "it serves the demo, not built yet: `make demo` builds it (a few minutes)"
    if area == "recommend-ray":
        example = ROOT / "examples" / "recommend"
        if not (example / "artifacts" / "graph.yaml").is_file():
            return ("the recommender example's data and artifacts are missing: in "
                    "examples/recommend run `python generate.py --out data` and `python train.py "
                    "--data data --out artifacts` (about ten minutes)")
    given = (area == "feast-offline" and args.feast_python) or (
        area == "recommend-ray" and args.ray_python)
    missing = [peer for peer in _peers_of(area) if envs.find(peer) is None]
    if not missing or given or args.install_peers:
        return ""
    titles = [envs.PEERS[peer].title for peer in missing]
    minutes = sum(envs.PEERS[peer].minutes for peer in missing)
    what = (f"{titles[0]} runs from its own environment" if len(titles) == 1 else
            f"{', '.join(titles[:-1])} and {titles[-1]} run from their own environments")
    return (f"{what}, not made yet: `bash benchmarks/peers/setup.sh {' '.join(missing)}` makes "
            f"{'it' if len(missing) == 1 else 'them'} (about {minutes} min), "
            "or pass --install-peers")


def _peers_of(area: str) -> tuple[str, ...]:
    """The peer environments an area runs (none, one or several)."""
    peers = AREA_PEERS.get(area, ())
    return (peers,) if isinstance(peers, str) else peers


def _run(command: list[str], show: bool = False) -> str:
    """The command's standard output; ``show`` passes its progress through instead (the
    benchmarks that write their result to a file print a line per measured cell)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if show:
        subprocess.run(command, cwd=ROOT, env=env, stdout=sys.stderr, check=True)
        return ""
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-2000:])
        raise subprocess.CalledProcessError(done.returncode, command[:3])
    return done.stdout


def _stamp(args: argparse.Namespace, command: list[str], rounds: int | None = None) -> str:
    """The line above a table: command, date, commit, machine."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    shown = f"`{_shown(command, args)}`"
    if rounds:
        shown += f" ({rounds} round{'s' if rounds > 1 else ''})"
    return (f"`make bench`: {shown} · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · "
            f"commit {commit}{' + local changes' if dirty else ''} · {os.cpu_count()} cores, "
            f"{args.machine} (load average {load:.1f})")


def _shown(command: list[str], args: argparse.Namespace) -> str:
    """The command as the page prints it: no machine paths."""
    names = {PY: "python", str(args.feast_python): "$FEAST_PYTHON",
             str(args.ray_python): "$RAY_PYTHON"}
    parts = []
    skip = False
    for part in command:
        if skip:
            skip = False
            continue
        if part in ("--out", "--json-out"):
            skip = True
            continue
        for path, name in names.items():
            if path != "None":
                part = part.replace(path, name)
        parts.append(part)
    return " ".join(parts)


_WORK: list[Path] = []  # this run's work folder, made on first use


def _scratch(name: str) -> Path:
    """A file in this run's own work folder (made on first use, removed when the run exits),
    so two runs at once never read or delete each other's results."""
    if not _WORK:
        _WORK.append(Path(tempfile.mkdtemp(prefix=f"redline-bench-{os.getuid()}-")))
        atexit.register(shutil.rmtree, _WORK[0], ignore_errors=True)
    return _WORK[0] / name


def _given(flag: str, value: Path | None) -> list[str]:
    """``[flag, value]`` when the value was given, else nothing (the script's default)."""
    return [flag, str(value)] if value else []


def _range(values: list[float]) -> str:
    return f"{number(min(values))}–{number(max(values))}"


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _report(outcomes: list[Outcome]) -> None:
    print()
    for outcome in outcomes:
        print(f"## {outcome.area}\n")
        print(outcome.body or f"skipped: {outcome.skipped}")
        print()
    print("Targets:")
    for outcome in outcomes:
        for target in outcome.targets:
            print(f"  {outcome.area}: {target.name} {target.op} {number(target.bound)}"
                  f"{target.unit}: {number(target.value)}{target.unit}, {target.verdict()}")


if __name__ == "__main__":
    sys.exit(main())
