"""A shadow rollout's copies: baseline requests run again on the candidate, off the critical path.

A copy starts after the primary's response has gone and runs on the candidate's own session.
When ``shadow_max_in_flight`` copies are running a new one is dropped (and counted), never
queued, so a slow candidate cannot build a backlog behind the baseline's traffic.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from redline.scaling.rollout.spec import RolloutSpec
from redline.scaling.rollout.stats import ShadowStats

# What becomes of a copy's answer: (rollout, its counts, the baseline's outputs, the candidate's).
Answered = Callable[[RolloutSpec, ShadowStats, Any, Any], None]


class ShadowCopies:
    """Starts the copies of a shadow rollout and hands each answer to ``answered``."""

    def __init__(self, registry: Any, answered: Answered, rng: random.Random) -> None:
        self.registry = registry
        self.answered = answered
        self._random = rng
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, spec: RolloutSpec, record: Any, stats: ShadowStats) -> None:
        """A copy of ``record``'s request, if it is in the shadow's share and there is room."""
        if spec.percent < 100 and self._random.random() * 100 >= spec.percent:
            return
        if len(self._tasks) >= spec.shadow_max_in_flight:
            stats.dropped += 1
            return
        try:
            candidate = self.registry.get(spec.model, str(spec.candidate))
            loop = asyncio.get_running_loop()
        except Exception:  # noqa: BLE001 - not loaded yet, or no loop: nothing to shadow
            return
        stats.sent += 1
        task = loop.create_task(self._copy(spec, candidate, record.inputs, record.outputs,
                                           stats))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _copy(self, spec: RolloutSpec, candidate: Any, inputs: Any, primary: Any,
                    stats: ShadowStats) -> None:
        await asyncio.sleep(0)  # after the primary's response has gone
        start = time.perf_counter_ns()
        try:
            outputs = await candidate.infer(inputs, None, validate=False)
        except Exception:  # noqa: BLE001 - a failing candidate is what shadowing is for
            stats.errors += 1
            stats.candidate.add(False, (time.perf_counter_ns() - start) / 1000)
            return
        stats.candidate.add(True, (time.perf_counter_ns() - start) / 1000)
        self.answered(spec, stats, primary, outputs)
