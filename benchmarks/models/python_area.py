"""``make bench``'s ``python-peers`` area: ``python_compare.py``'s run as docs/performance.md
prints it (the command, the targets met or not, a table per workload)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_page import Target, number, table, targets_table

# The peer environments the area runs (benchmarks/peers/envs.py).
PEERS = ("pytriton", "mlserver", "ray-serve")
RESULT = "python_peers.json"

NAMES = {
    "redline": "**redline**, `model.py`", "redline_onnx": "**redline**, ONNX (`ReduceSum`)",
    "redline_grpc": "**redline**, `model.py`",
    "triton": "Triton, Python backend",
    "triton_batched": "Triton, Python backend, dynamic batching",
    "triton_grpc": "Triton, Python backend",
    "triton_batched_grpc": "Triton, Python backend, dynamic batching",
    "mlserver": "MLServer, custom runtime, main process",
    "mlserver_worker": "MLServer, custom runtime, default worker",
    "ray": "Ray Serve, throughput-optimized", "ray_batched": "Ray Serve, throughput-optimized, "
    "`@serve.batch`",
    "redline_graph": "**redline**, `graph.yaml`",
    "triton_ensemble": "Triton ensemble of three Python models",
    "triton_ensemble_batched": "Triton ensemble of three Python models, dynamic batching",
    "ray_graph": "Ray Serve composition of three deployments",
}
TARGET_NAMES = {
    "rowsum_c8_rps_vs_onnx": "Python model c=8 req/s over redline's ONNX path",
    "rowsum_c8_rps_vs_triton": "Python model c=8 req/s over Triton's best",
    "rowsum_c1_rps_vs_triton": "Python model c=1 req/s over Triton's best",
    "rowsum_c8_p99_vs_triton": "Python model c=8 p99 over Triton's best",
    "rowsum_c1_p99_vs_triton": "Python model c=1 p99 over Triton's best",
    "rowsum_c8_rps_vs_mlserver": "Python model c=8 req/s over MLServer's best",
    "rowsum_c8_rps_vs_ray": "Python model c=8 req/s over Ray Serve's best",
    "graph_c8_rps_vs_triton": "graph c=8 req/s over Triton's best ensemble",
    "graph_c8_p99_vs_triton": "graph c=8 p99 over Triton's best ensemble",
    "graph_max_rate_vs_triton": "graph's highest rate with p99 ≤ 5 ms over Triton's best",
    "graph_c8_rps_vs_ray": "graph c=8 req/s over Ray Serve's composition",
}


def plan(python: str, rounds: int, out: Path) -> list[str]:
    return [python, "benchmarks/models/python_compare.py", "--rounds", str(rounds),
            "--duration", "1.5", "--warmup", "0.5", "--ladder-duration", "1.5", "--out",
            str(out)]


def targets(result: dict) -> list[Target]:  # type: ignore[type-arg]
    """The issue's targets as the page's rows: each ratio's median over rounds, its spread,
    and in how many rounds it was met."""
    out = []
    for key, e in result["ratios"].items():
        if "target" not in e:
            continue
        op, bound = e["target"].split(" ", 1)
        against = NAMES.get(e["against"], e["against"]).replace("**", "")
        name = f"{TARGET_NAMES.get(key, key)} ({against})"
        ratio = e["ratio"]
        if ratio is None:  # neither sustained any rate: nothing to compare
            continue
        spread = f"{number(e['min'])}–{number(e['max'])}, met in {e['rounds_met']} rounds"
        if e.get("lower_bound"):  # the peer sustained no rate: the ratio is at least this
            spread += f"; a lower bound: {e['note']}"
        out.append(Target(name, "<=" if op.startswith("<") else ">=", float(bound),
                          float(ratio), spread=spread))
    return out


def _rows(result: dict) -> list[list[str]]:  # type: ignore[type-arg]
    """One row per server and protocol, the Python model's first, then the graph's."""
    by: dict[tuple[str, str, str], dict[int, dict]] = {}  # type: ignore[type-arg]
    for c in result["cells"]:
        by.setdefault((c["workload"], c["target"], c["protocol"]), {})[c["concurrency"]] = c
    rows = []
    for (work, name, protocol), cells in sorted(by.items(), key=lambda kv: kv[0][0] != "rowsum"):
        row = [WORKLOADS[work], NAMES.get(name, name), "gRPC" if protocol == "grpc" else "JSON"]
        for c in (1, 8):
            cell = cells.get(c)
            row += ([f"{cell['rps']:,.0f} ({cell['rps_min']:,.0f}–{cell['rps_max']:,.0f})",
                     f"{number(cell['p50_ms'])} / {number(cell['p99_ms'])}"] if cell
                    else ["—", "—"])
        eight = cells.get(8)
        cores = eight.get("server_cores") if eight else None
        row.append("—" if not eight else number(eight["server_cpu_us_per_req"])
                   + ("" if cores is None else f" ({cores:.2f})"))
        rate = (cells.get(1) or eight or {}).get("max_rate_p99_ok")
        row.append("—" if rate is None else f"{rate:,.0f}")
        rows.append(row)
    return rows


WORKLOADS = {"rowsum": "no work", "graph": "3 steps"}


def render(stamp: str, result: dict) -> tuple[str, list[Target]]:  # type: ignore[type-arg]
    """The page's block and its targets."""
    found = targets(result)
    header = ["model", "server", "protocol", "c=1 req/s (min–max)", "c=1 p50 / p99 ms",
              "c=8 req/s (min–max)", "c=8 p50 / p99 ms", "c=8 server CPU µs/req (cores)",
              f"top rate, p99 ≤ {result['p99_bound_ms']:g} ms"]
    skipped = [f"{TARGET_NAMES.get(k, k)}: {e['note']}" for k, e in result["ratios"].items()
               if e.get("ratio") is None and "note" in e]
    lines = [stamp, "", *targets_table(found)]
    grpc = [f"{e['ratio']:.2f}x at c={k.split('_c')[1][0]}" for k, e in result["ratios"].items()
            if k.startswith("rowsum_grpc_") and e.get("ratio") is not None]
    if grpc:
        lines += ["", "gRPC, beside it: redline's Python model over Triton's best gRPC "
                  f"configuration, req/s: {', '.join(sorted(grpc, key=lambda g: g[-1]))}."]
    cpu = _cpu_line(result)
    if cpu:
        lines += ["", cpu]
    if skipped:
        lines += ["", "Not compared: " + "; ".join(skipped) + "."]
    return "\n".join([*lines, "", *table(header, _rows(result))]), found


# (ratio whose "against" names the peer configuration, redline's target, what the line calls it)
_CPU_PAIRS = (("rowsum_c8_rps_vs_onnx", "redline", "redline's ONNX path"),
              ("rowsum_c8_rps_vs_triton", "redline", "Triton"),
              ("rowsum_c8_rps_vs_mlserver", "redline", "MLServer"),
              ("rowsum_c8_rps_vs_ray", "redline", "Ray Serve"),
              ("graph_c8_rps_vs_triton", "redline_graph", "Triton's ensemble"),
              ("graph_c8_rps_vs_ray", "redline_graph", "Ray Serve's composition"))


def _cpu_line(result: dict) -> str:  # type: ignore[type-arg]
    """Server CPU time per request at c=8, each peer's (its configuration the c=8 targets are
    against) over redline's: the figure a busy shared machine disturbs least."""
    cpu = {c["target"]: c["server_cpu_us_per_req"] for c in result["cells"]
           if c["concurrency"] == 8}
    parts = []
    for key, mine, label in _CPU_PAIRS:
        entry = result["ratios"].get(key)
        theirs = cpu.get(entry["against"]) if entry else None
        if theirs and cpu.get(mine):
            parts.append(f"{label} {theirs / cpu[mine]:.1f}x")
    if not parts:
        return ""
    return ("Server CPU time per request at c=8 (the figure a busy machine disturbs least), "
            "each peer's over redline's: " + ", ".join(parts) + ".")
