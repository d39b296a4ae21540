"""The labels a rollout judges: each version's (score, label) pairs joined since it began.

The label joins belong to monitoring (one quality monitor per model version); a rollout only
reads them. Pairs joined before the rollout started are another rollout's, so the count a join
had at the start is kept and only what came after is judged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from redline.scaling.rollout.spec import RolloutSpec

LabelSource = Callable[[str, str], Any]  # (model, version) -> its QualityMonitor, or None


async def labels_since_start(labels: LabelSource, spec: RolloutSpec,
                             joined_at: dict[tuple[str, int, float], int]
                             ) -> dict[int, np.ndarray] | None:
    """Each version's pairs joined since ``spec`` started, or None when a shared label join
    cannot be read now (judged next time). ``joined_at`` keeps each join's count at the start
    of a rollout; a shared join is read on a worker thread, never on the loop."""
    pairs: dict[int, np.ndarray] = {}
    for version in (spec.baseline, spec.candidate):
        quality = labels(spec.model, str(version))
        mark_key = (spec.model, version, spec.started)
        if quality is None:
            # No monitor yet: whatever it joins comes after the start.
            joined_at.setdefault(mark_key, 0)
            pairs[version] = np.zeros((0, 2))
            continue
        try:
            snap = await asyncio.to_thread(quality.state.snapshot)
        except Exception:  # noqa: BLE001 - a shared join down: judged next time
            return None
        mark = joined_at.setdefault(mark_key, snap.joined)
        fresh = min(max(0, snap.joined - mark), int(snap.labelled.shape[0]))
        pairs[version] = snap.labelled[snap.labelled.shape[0] - fresh:] if fresh \
            else np.zeros((0, 2))
    return pairs
