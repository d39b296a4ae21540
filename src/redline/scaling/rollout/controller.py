"""The rollout controller: one per server process, following the rollout file.

It routes a canary's share of default-version requests to the candidate, counts every request
of both versions, runs a shadow's copies, and rolls the candidate back when the sums over
every process cross a bound (``verdict.py``, ``answers.py``). Whichever process first sees a
bound crossed writes the rollback into the file; the others follow it on their next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from redline.errors import InvalidInput
from redline.scaling.rollout.answers import (
    AnswerSample,
    MergedAnswers,
    judge_answers,
    judge_labels,
    judge_mismatch,
    label_loss,
    same_answer,
)
from redline.scaling.rollout.labels import LabelSource, labels_since_start
from redline.scaling.rollout.shadow import ShadowCopies
from redline.scaling.rollout.spec import ACTIVE, RolloutFile, RolloutSpec
from redline.scaling.rollout.stats import MergedStats, ShadowStats, VersionStats
from redline.scaling.rollout.stats_files import read_peers, write_stats_file
from redline.scaling.rollout.verdict import CLIENT_ERRORS, service_verdict

if TYPE_CHECKING:
    from redline.serving.stages import RequestRecord

log = logging.getLogger("redline.scaling")

ANSWERS_EVERY = 25  # candidate answers between two judgements of the answers
LABELS_EVERY_S = 2.0  # how often the labels joined since the start are judged


def sticky_share(entities: Any) -> float:
    """A stable number in [0, 100) for an entity (its keys and ids), the same in every process."""
    row = entities[0] if isinstance(entities, list) and entities else entities
    text = json.dumps(row, sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest()) % 10000 / 100


class RolloutController:
    """Routes default-version requests, counts per version, shadows, and rolls back.

    Installed on a server by ``install.py``: it becomes the registry's ``router`` and, while a
    rollout is active, one of the server's request observers. Only then: a second observer
    makes every request keep its record for it, which costs the monitored common request the
    flat stage times it leaves when the monitor is the one observer (``serving/stages.py``).
    """

    CHECKS = ("errors", "latency", "predictions", "mismatch", "labels")

    def __init__(self, registry: Any, path: str | os.PathLike[str],
                 instance: str | None = None, labels: LabelSource | None = None) -> None:
        self.registry = registry
        self.file = RolloutFile(path)
        self.instance = instance or str(os.getpid())  # names this process's stats file
        self.labels = labels  # the quality monitors' label joins, when monitoring is on
        self._peers: dict[tuple[str, int], MergedStats] = {}
        self._peer_answers: dict[tuple[str, int], MergedAnswers] = {}
        self._peer_shadow: dict[str, tuple[int, int]] = {}
        self._peers_read = float("-inf")
        self.active: dict[str, RolloutSpec] = {}
        self.stats: dict[tuple[str, int], VersionStats] = {}
        self.answers: dict[tuple[str, int], AnswerSample] = {}
        self.shadow: dict[str, ShadowStats] = {}
        self.label_losses: dict[str, dict[str, Any]] = {}  # model -> version -> loss figures
        self.rollbacks: dict[tuple[str, str], int] = {}  # (model, check) -> rollbacks decided
        self._joined_at: dict[tuple[str, int, float], int] = {}
        self._labels_checked = float("-inf")
        self._labels_task: asyncio.Task[None] | None = None
        self._mtime: float | None = None
        self._checked = 0.0
        self._written = 0.0
        self._random = random.Random()
        self._shadows = ShadowCopies(registry, self._shadow_answered, self._random)
        self._started: dict[str, float] = {}
        self._keeping: set[Any] = set()
        self.observers: Any = None  # the server's Observers, once installed
        self.refresh(force=True)

    def observe(self, observers: Any) -> None:
        """Be one of ``observers`` whenever a rollout is active (and only then)."""
        self.observers = observers
        self._watch_requests()

    def _watch_requests(self) -> None:
        observers = self.observers
        if observers is None:
            return
        if self.active and self not in observers:
            observers.add(self)
        elif not self.active and self in observers:
            observers.remove(self)

    # ------------------------------------------------------------------ the rollout file
    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < 0.5:
            if self._labels_checked == float("-inf"):
                self._check_labels(now)  # a new rollout's start marks, before its labels
            return
        self._checked = now
        try:
            mtime = self.file.path.stat().st_mtime
        except OSError:
            mtime = None
        if mtime != self._mtime or force:
            self._mtime = mtime
            try:
                rollouts = self.file.read()
            except InvalidInput as exc:
                log.warning("%s", exc)
                return
            self.active = {n: s for n, s in rollouts.items() if s.state == ACTIVE}
            for name, spec in self.active.items():
                if self._started.get(name) != spec.started:
                    # A new rollout of this model: its counts start from zero.
                    self._started[name] = spec.started
                    self.shadow.pop(name, None)
                    self.label_losses.pop(name, None)
                    for table in (self.stats, self.answers):
                        for key in [k for k in table if k[0] == name]:
                            del table[key]  # type: ignore[attr-defined]
                    self._written = float("-inf")  # the stats file forgets the old counts now
                    # The label joins' counts at the start, before this rollout's labels come.
                    self._labels_checked = float("-inf")
            self._release_io()
            self._watch_requests()
        for spec in self.active.values():
            self._keep_io(spec)  # again: a candidate loads after the rollout starts
        if now - self._written > 1.0 and (self.stats or self.shadow or self.answers
                                          or self._written == float("-inf")):
            self._written = now
            self._write_stats()
        if now - self._labels_checked > LABELS_EVERY_S:
            self._check_labels(now)

    def _check_labels(self, now: float) -> None:
        """Judge the labels on the loop, one check at a time (from a thread without a
        loop nothing starts: the next refresh on the server's loop does it)."""
        if self.labels is None or not self.active or not (
                self._labels_task is None or self._labels_task.done()):
            return
        with contextlib.suppress(RuntimeError):
            self._labels_task = asyncio.get_running_loop().create_task(
                self._judge_labels(list(self.active.values())))
            self._labels_checked = now

    def _keep_io(self, spec: RolloutSpec) -> None:
        """Every request of the versions judged keeps its arrays: a shadow replays the
        baseline's, and the answers of both are compared."""
        versions = (spec.baseline,) if spec.mode == "shadow" else (spec.baseline, spec.candidate)
        for version in versions:
            with contextlib.suppress(Exception):  # not loaded (yet): the next refresh
                handle = self.registry.get(spec.model, str(version))
                if handle not in self._keeping:
                    handle.keep_every_request(True)  # not only monitoring's sample
                    self._keeping.add(handle)

    def _release_io(self) -> None:
        """Handles no longer in a rollout stop keeping each request's arrays."""
        wanted = {(s.model, v) for s in self.active.values()
                  for v in ((s.baseline,) if s.mode == "shadow" else (s.baseline, s.candidate))}
        for handle in list(self._keeping):
            if (handle.name, handle.version) not in wanted:
                handle.keep_every_request(False)
                self._keeping.discard(handle)

    # ------------------------------------------------------------------ the other processes
    def _write_stats(self) -> None:
        models = {m for m, _ in self.stats} | set(self.shadow) | {m for m, _ in self.answers}
        write_stats_file(self.file.stats_dir, self.instance, {
            "pid": os.getpid(), "time": time.time(),
            "started": {m: self._started[m] for m in models if m in self._started},
            "versions": {f"{m}:{v}": s.as_dict() for (m, v), s in self.stats.items()},
            "answers": {f"{m}:{v}": a.as_dict() for (m, v), a in self.answers.items()},
            "shadow": {m: s.as_dict() for m, s in self.shadow.items()},
            "labels": self.label_losses})

    def _peer_stats(self) -> dict[tuple[str, int], MergedStats]:
        """The other processes' counts for the rollouts running now (their files, re-read at
        most twice a second; a file of an older rollout of the same model is ignored)."""
        now = time.monotonic()
        if now - self._peers_read < 0.5:
            return self._peers
        self._peers_read = now
        self._peers, self._peer_answers, self._peer_shadow = read_peers(
            self.file.stats_dir, self.instance, self.active)
        return self._peers

    def merged(self, model: str, version: int) -> MergedStats:
        """This process's live counts plus every other process's last written ones."""
        out = MergedStats()
        own = self.stats.get((model, version))
        if own is not None:
            out.add(own.requests, own.errors, own.histogram(), own.refused)
        peer = self._peer_stats().get((model, version))
        if peer is not None:
            out.merge(peer)
        return out

    def merged_answers(self, model: str, version: int) -> MergedAnswers:
        """This process's answer sample plus the other processes' last written ones."""
        out = MergedAnswers()
        own = self.answers.get((model, version))
        if own is not None:
            out.add_sample(own)
        self._peer_stats()
        peer = self._peer_answers.get((model, version))
        if peer is not None:
            for name in peer.rows:
                out.add(name, *peer.get(name))
        return out

    # ------------------------------------------------------------------ request path
    def route(self, name: str, key: Any = None) -> Any:
        """The candidate's handle when this request is the candidate's share, else None."""
        self.refresh()
        spec = self.active.get(name)
        if spec is None or spec.mode != "canary":
            return None
        share = sticky_share(key) if spec.sticky and key is not None else \
            self._random.random() * 100
        if share >= spec.percent:
            return None
        try:
            return self.registry.get(name, str(spec.candidate))
        except Exception:  # noqa: BLE001 - candidate not loaded (yet): the baseline serves
            return None

    def request_finished(self, record: RequestRecord) -> None:
        spec = self.active.get(record.model)
        if spec is None or not record.version:
            return
        version = int(record.version)
        if version not in (spec.baseline, spec.candidate):
            return
        status = record.status
        stats = self.stats.setdefault((spec.model, version), VersionStats())
        refused = status in CLIENT_ERRORS
        if refused:
            stats.refuse(status)  # the client's doing, unless only the candidate refuses it
        else:
            stats.add(status == "ok", record.total_us)
        if status == "ok" and record.outputs is not None:
            self._answer_sample(spec.model, version).add(record.outputs)
        if spec.mode == "shadow":
            if version == spec.baseline and status == "ok" and record.inputs is not None:
                self._start_shadow(spec, record)
            return
        if version != spec.candidate:
            return
        if stats.seen % 10 == 0:
            # Decided on the sums over every worker (and replica sharing the project folder),
            # so N workers take one decision on N times the traffic, not N on a share each.
            verdict = service_verdict(spec, self.merged(spec.model, spec.baseline),
                                      self.merged(spec.model, spec.candidate))
            if verdict is not None:
                self.roll_back(spec, verdict[1], verdict[0])
                return
        if not refused and stats.requests % ANSWERS_EVERY == 0:
            self._judge_answers(spec)

    def _answer_sample(self, model: str, version: int) -> AnswerSample:
        sample = self.answers.get((model, version))
        if sample is None:
            sample = self.answers[(model, version)] = AnswerSample()
        return sample

    def _judge_answers(self, spec: RolloutSpec) -> None:
        why = judge_answers(spec, self.merged_answers(spec.model, spec.baseline),
                            self.merged_answers(spec.model, spec.candidate))
        if why is not None:
            self.roll_back(spec, why, "predictions")

    async def _judge_labels(self, specs: list[RolloutSpec]) -> None:
        """The loss of each version over the labels joined since its rollout began."""
        assert self.labels is not None
        for spec in specs:
            pairs = await labels_since_start(self.labels, spec, self._joined_at)
            if pairs is None:
                return  # a shared label join is down: every rollout is judged next time
            if not self._running(spec):
                continue  # ended (or replaced) meanwhile
            self.label_losses[spec.model] = {str(v): label_loss(p) for v, p in pairs.items()}
            why = judge_labels(spec, pairs[spec.baseline], pairs[spec.candidate])
            if why is not None:
                self.roll_back(spec, why, "labels")

    def _running(self, spec: RolloutSpec) -> bool:
        """Whether ``spec``'s rollout is still the model's running one (the file re-read
        makes new objects of the same rollout)."""
        current = self.active.get(spec.model)
        return current is not None and current.started == spec.started

    def roll_back(self, spec: RolloutSpec, why: str, check: str = "errors") -> None:
        if not self._running(spec):
            return  # already ended here (a decision from a check that was in flight)
        log.warning("rollout of %s v%s rolled back (%s): %s", spec.model, spec.candidate,
                    check, why)
        key = (spec.model, check)
        self.rollbacks[key] = self.rollbacks.get(key, 0) + 1
        self.active.pop(spec.model, None)
        self._release_io()
        self._watch_requests()
        try:
            self.file.update(spec.model, state="rolled_back", reason=why, failed_check=check)
        except Exception as exc:  # noqa: BLE001 - the file may be read-only: still stop here
            log.warning("cannot record the rollback in %s: %s", self.file.path, exc)
        self._mtime = None

    # ------------------------------------------------------------------ shadow
    def _start_shadow(self, spec: RolloutSpec, record: Any) -> None:
        self._shadows.start(spec, record, self.shadow.setdefault(spec.model, ShadowStats()))

    def _shadow_answered(self, spec: RolloutSpec, stats: ShadowStats, primary: Any,
                         outputs: Any) -> None:
        """A shadow copy's answer: compared with the baseline's, and judged every so often."""
        if not self._running(spec):
            return  # the rollout ended while this copy ran
        self._answer_sample(spec.model, spec.candidate).add(outputs)
        stats.compared += 1
        same, diff = same_answer(primary, outputs, spec.answer_rtol, spec.answer_atol)
        stats.max_abs_diff = max(stats.max_abs_diff, diff)
        if not same:
            stats.mismatched += 1
        if stats.compared % ANSWERS_EVERY == 0:
            self._peer_stats()
            compared, mismatched = self._peer_shadow.get(spec.model, (0, 0))
            why = judge_mismatch(spec, stats.compared + compared, stats.mismatched + mismatched)
            if why is not None:
                self.roll_back(spec, why, "mismatch")
                return
            self._judge_answers(spec)

    def report(self) -> dict[str, Any]:
        return {"rollouts": {n: asdict(s) for n, s in self.active.items()},
                "versions": {f"{m}:{v}": s.as_dict() for (m, v), s in self.stats.items()},
                "shadow": {m: s.as_dict() for m, s in self.shadow.items()}}
