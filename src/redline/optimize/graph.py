"""Candidates that change how ONNX Runtime runs the same model: a higher graph optimization
level and more intra-op threads than the configured ones. The bytes stay the same; the settings
are what gets recommended and recorded.

Lower levels than the configured one are never tried: they run a less rewritten copy of the
same graph, so a speed-up measured for one is the machine's noise, not the model's.
"""

from __future__ import annotations

from collections.abc import Iterator

from redline.optimize.candidates import Candidate, Skipped, TuneContext

LEVELS = ("disable", "basic", "extended", "all")


def graph_candidates(model: bytes, ctx: TuneContext) -> Iterator[Candidate | Skipped]:
    base = ctx.base_settings
    start = LEVELS.index(base.graph_optimization) if base.graph_optimization in LEVELS else 0
    threads = [base.intra_op_threads]
    if 1 <= base.intra_op_threads < 2 <= ctx.cpu_count:  # 0 already means every core
        threads.append(2)
    variants = [(level, n) for level in LEVELS[start:] for n in threads
                if (level, n) != (base.graph_optimization, base.intra_op_threads)]
    if not variants:
        yield Skipped("graph", "graph", f"the configured settings (graph optimization "
                      f"'{base.graph_optimization}', {base.intra_op_threads} intra-op "
                      "thread(s)) are already the most ONNX Runtime offers on this machine")
    for level, n in variants:
        name = f"graph-{level}" + (f"-{n}threads" if n > 1 else "")
        yield Candidate(
            name, "graph", model,
            settings={"graph_optimization": level, "intra_op_threads": n},
            recipe={"graph_optimization": level, "intra_op_threads": n},
            note="same model, different ONNX Runtime settings",
        )
