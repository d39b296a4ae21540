"""Which candidates may be measured at all: each is run once on the choice and evaluation
rows, and one that does not load, breaks the original's contract, has a non-finite weight the
original lacks, or answers NaN or infinity where the original answers a number is set aside
before any metric or latency is taken."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from redline.errors import RedlineError
from redline.optimize.candidates import Candidate, Skipped
from redline.optimize.contract import Contract, contract_breaks
from redline.optimize.options import Progress
from redline.optimize.profile import ModelRunner, Outputs
from redline.optimize.safety import nonfinite_outputs, rejection

Answers = dict[str, tuple[Outputs, Outputs]]  # candidate -> outputs on (choice, evaluation) rows


def screen(candidates: list[Candidate], runner_of: Callable[[Candidate], ModelRunner],
           rows: tuple[np.ndarray, np.ndarray], contract: Contract, probe: np.ndarray | None,
           answered: np.ndarray | None, allowed_bad: int, bar: Progress
           ) -> tuple[Answers, list[Skipped], list[Skipped]]:
    """The answers of each candidate kept (the original first), the candidates that did not
    load, and those rejected; one session alive at a time."""
    x_choice, x_eval = rows
    outputs: Answers = {}
    unloaded: list[Skipped] = []
    rejected: list[Skipped] = []
    bar.stage("evaluating (one model at a time)", len(candidates))
    for cand in candidates:
        try:
            runner = runner_of(cand)
        except RedlineError as exc:
            unloaded.append(Skipped(cand.name, cand.technique, exc.message))
            bar.advance(detail=f"{cand.name}: skipped, it does not load")
            continue
        pair = (runner.predict(x_choice), runner.predict(x_eval))
        broken = None if cand.name == "original" else contract_breaks(contract, runner, probe,
                                                                      answered)
        del runner
        why = f"breaks the original's contract: {broken}" if broken else (
            None if cand.name == "original" else
            why_rejected(cand, allowed_bad, outputs["original"], pair))
        if why:
            rejected.append(Skipped(cand.name, cand.technique, f"rejected: {why}"))
            bar.advance(detail=f"{cand.name}: rejected")
            continue
        outputs[cand.name] = pair
        bar.advance(detail=cand.name)
    return outputs, unloaded, rejected


def why_rejected(cand: Candidate, allowed_bad: int, ref: tuple[Outputs, Outputs],
                 pair: tuple[Outputs, Outputs]) -> str | None:
    """Why a candidate's weights or answers are not finite where the original's are, or None."""
    why = rejection(cand.onnx_bytes, allowed_weights=allowed_bad)
    if why:
        return why
    for (r, o), rows in zip(zip(ref, pair, strict=True), ("choice", "evaluation"), strict=True):
        bad = nonfinite_outputs(r.scores, o.scores)
        if bad:
            return (f"answers NaN or infinity on {bad} of {len(o.scores)} {rows} rows where the "
                    "original answers a number")
    return None
