"""Candidates that change how ONNX Runtime runs the same model: graph optimization level and
thread count. The bytes stay the same; the settings are what gets recommended and recorded."""

from __future__ import annotations

from collections.abc import Iterator

from redline.optimize.candidates import Candidate, Skipped, TuneContext

LEVELS = ("disable", "basic", "extended", "all")


def graph_candidates(model: bytes, ctx: TuneContext) -> Iterator[Candidate | Skipped]:
    base = ctx.base_settings
    variants = [(level, 1) for level in LEVELS]
    if ctx.cpu_count >= 2:
        variants.append(("all", 2))
    for level, threads in variants:
        if level == base.graph_optimization and threads == base.intra_op_threads:
            continue  # that is the original as configured
        name = f"graph-{level}" + (f"-{threads}threads" if threads > 1 else "")
        yield Candidate(
            name, "graph", model,
            settings={"graph_optimization": level, "intra_op_threads": threads},
            recipe={"graph_optimization": level, "intra_op_threads": threads},
            note="same model, different ONNX Runtime settings",
        )
