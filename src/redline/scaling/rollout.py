"""Canary and shadow rollouts of a candidate model version, with automatic rollback.

The rollout of a model is a small JSON document in ``scaling.rollout_file`` (written by
``redline rollout start|promote|abort``). Every server process polls it (a ``stat`` at most
twice a second, from the request path) so all workers and replicas sharing the project folder
follow the same rollout, and a rollback decided by one is seen by all.

- **canary**: ``percent`` of the model's default-version traffic goes to the candidate, chosen
  at random per request, or *sticky* by entity key for ``/v1`` (the same entity always sees the
  same version: a stable hash of its keys). Each process counts per version: requests, server
  errors and latency; a client's mistake (invalid input, an unknown feature) counts against
  neither version, but each version's refusals are counted by code. Once both versions have
  ``min_requests``, the candidate is rolled back when its error rate exceeds the baseline's by
  ``max_error_rate_delta``, when it refuses a kind of request the baseline serves (its rate of
  a refusal code exceeds the baseline's on the same traffic by ``max_error_rate_delta`` and by
  more than chance: a ``/v1`` candidate that cannot assemble its input answers every request
  400), or when its p99 exceeds the baseline's by ``max_p99_ratio`` (and by at least
  ``min_p99_delta_ms``, so a sub-millisecond jitter is not a regression).
- **shadow**: every (or ``percent`` of) baseline request is run again on the candidate after
  the response is done, off the critical path (its own ORT thread, bounded concurrency: when
  more than ``shadow_max_in_flight`` are running a copy is dropped, never queued). Outputs are
  compared (``numpy.allclose`` within ``answer_rtol``/``answer_atol``) and latencies recorded;
  the response never changes.

Errors and latency do not show a candidate that answers wrongly (a constant, a rescaled score),
so a rollout judges the answers too (``rollout_answers.py``): each output's distribution
against the baseline's on the same traffic, a shadow's mismatch rate, and the loss against
labels where they arrive. While a rollout runs, both versions keep every request's arrays
(``handle.shadowed``) for it. Every check has a bound with a default in ``scaling.rollout_*``
and waits for a minimum sample; crossing one rolls back, with the reason in the rollout file
(``redline rollout status``), one WARNING line in the log and
``redline_rollout_rollbacks_total{model, check}``.

Per-version counts are kept here, per process, and each process writes them beside the rollout
file (``<file>.stats/<pid>.json``, with a latency histogram) once a second. The rollback
decision is taken on the sum over every process of the rollout - this one's live counts plus
the others' files (read at most twice a second): with ``redline serve --workers N`` the workers
decide on the same numbers, ``min_requests`` means requests to the service rather than to one
worker, the p99 is the p99 of the merged histograms (5% buckets), and whichever worker first
sees the sum cross a threshold writes the rollback that every worker then follows.
``redline rollout status`` shows the same sums. The Prometheus metrics (``monitoring``) carry
the same requests labelled by version.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.config import ScalingSettings
from redline.errors import InvalidInput, NotFound
from redline.scaling.rollout_answers import (
    AnswerSample,
    MergedAnswers,
    compare_answers,
    judge_answers,
    judge_labels,
    judge_mismatch,
    label_loss,
    same_answer,
)

if TYPE_CHECKING:
    from redline.serving.server import RedlineServer

log = logging.getLogger("redline.scaling")

# Request outcomes that are the client's doing: they never count against a version...
CLIENT_ERRORS = frozenset({"invalid_input", "payload_too_large", "not_found", "model_not_found",
                           "version_not_found", "feature_not_found", "unauthorized",
                           "overloaded"})
# ...unless the candidate answers one of these more often than the baseline on the same
# traffic: then it refuses requests the baseline serves (overload is the latency check's).
JUDGED_REFUSALS = frozenset({"invalid_input", "payload_too_large", "feature_not_found"})
ACTIVE = "running"
_DEFAULTS = ScalingSettings()  # config.py holds every default
ANSWERS_EVERY = 25  # candidate answers between two judgements of the answers
LABELS_EVERY_S = 2.0  # how often the labels joined since the start are judged


@dataclass
class RolloutSpec:
    """One model's rollout, as stored in the rollout file."""

    model: str
    baseline: int
    candidate: int
    mode: str = "canary"  # canary | shadow
    percent: float = 10.0
    sticky: bool = False
    min_requests: int = _DEFAULTS.rollout_min_requests
    max_error_rate_delta: float = _DEFAULTS.rollout_max_error_rate_delta
    max_p99_ratio: float = _DEFAULTS.rollout_max_p99_ratio
    min_p99_delta_ms: float = 1.0
    shadow_max_in_flight: int = 4
    min_answers: int = _DEFAULTS.rollout_min_answers
    max_prediction_psi: float = _DEFAULTS.rollout_max_prediction_psi
    max_mismatch_rate: float = _DEFAULTS.rollout_max_mismatch_rate
    answer_rtol: float = _DEFAULTS.rollout_answer_rtol
    answer_atol: float = _DEFAULTS.rollout_answer_atol
    min_labels: int = _DEFAULTS.rollout_min_labels
    max_loss_increase: float = _DEFAULTS.rollout_max_loss_increase
    state: str = ACTIVE  # running | promoted | aborted | rolled_back
    reason: str = ""
    failed_check: str = ""  # errors | latency | predictions | mismatch | labels
    started: float = field(default_factory=time.time)

    def check(self) -> None:
        if self.mode not in ("canary", "shadow"):
            raise InvalidInput(f"rollout mode must be canary or shadow, got {self.mode!r}")
        if not 0 < self.percent <= 100:
            raise InvalidInput(f"--percent must be in (0, 100], got {self.percent}")
        if self.candidate == self.baseline:
            raise InvalidInput(f"candidate version {self.candidate} is already the baseline")
        for flag, value in (("--min-requests", self.min_requests),
                            ("--min-answers", self.min_answers),
                            ("--min-labels", self.min_labels)):
            if value < 1:
                raise InvalidInput(f"{flag} must be at least 1 (too few answers never "
                                   f"decide), got {value}")
        if not 0 <= self.max_mismatch_rate <= 1:
            raise InvalidInput(f"--max-mismatch-rate must be in [0, 1] (1 turns the check "
                               f"off), got {self.max_mismatch_rate}")
        bound: float
        for flag, bound in (("--max-prediction-psi", self.max_prediction_psi),
                            ("--max-loss-increase", self.max_loss_increase),
                            ("--max-error-rate-delta", self.max_error_rate_delta),
                            ("--max-p99-ratio", self.max_p99_ratio),
                            ("scaling.rollout_answer_rtol", self.answer_rtol),
                            ("scaling.rollout_answer_atol", self.answer_atol)):
            if not (bound >= 0 and math.isfinite(bound)):
                raise InvalidInput(f"{flag} must be a finite number >= 0, got {bound}")


class RolloutFile:
    """Read and write the rollouts document atomically (write a temp file, then rename)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self) -> dict[str, RolloutSpec]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"rollout file {self.path} is unreadable: {exc}") from None
        return {name: RolloutSpec(**spec) for name, spec in doc.get("rollouts", {}).items()}

    def write(self, rollouts: dict[str, RolloutSpec]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"rollouts": {n: asdict(s) for n, s in rollouts.items()}},
                                  indent=2))
        tmp.replace(self.path)

    def update(self, name: str, **changes: Any) -> RolloutSpec:
        rollouts = self.read()
        spec = rollouts.get(name)
        if spec is None:
            raise NotFound(f"no rollout for model '{name}' (start one with `redline rollout "
                           f"start -m {name} --candidate N`)")
        for key, value in changes.items():
            setattr(spec, key, value)
        self.write(rollouts)
        return spec

    @property
    def stats_dir(self) -> Path:
        return self.path.with_name(self.path.name + ".stats")


_STEP = math.log(1.05)  # latency histogram buckets: 5% wide


def _bucket_of(lat_us: np.ndarray) -> np.ndarray:
    return np.floor(np.log(np.maximum(lat_us, 1.0)) / _STEP).astype(np.int64)


def _histogram_p99_ms(hist: dict[int, int]) -> float:
    """The p99 of a merged histogram: the upper edge of the bucket holding it."""
    total = sum(hist.values())
    if not total:
        return 0.0
    rank = math.ceil(0.99 * total)
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return math.exp((bucket + 1) * _STEP) / 1000.0
    return 0.0  # pragma: no cover - the loop always reaches the rank


class VersionStats:
    """Requests, server errors and recent latencies of one model version in this process, and
    the requests it refused as the client's mistakes (by code, beside ``requests``)."""

    def __init__(self, window: int = 4096) -> None:
        self.requests = 0
        self.errors = 0
        self.refused: dict[str, int] = {}
        self._lat_us: list[float] = []
        self._window = window

    def refuse(self, code: str) -> None:
        self.refused[code] = self.refused.get(code, 0) + 1

    @property
    def seen(self) -> int:
        """Every request, refused ones included."""
        return self.requests + sum(self.refused.values())

    def add(self, ok: bool, total_us: float) -> None:
        self.requests += 1
        if not ok:
            self.errors += 1
        lat = self._lat_us
        lat.append(total_us)
        if len(lat) > 2 * self._window:
            del lat[: len(lat) - self._window]

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def p99_ms(self) -> float:
        if not self._lat_us:
            return 0.0
        return float(np.percentile(self._lat_us[-self._window:], 99)) / 1000.0

    def histogram(self) -> dict[int, int]:
        """The recent latencies as 5%-wide buckets: what other processes merge."""
        if not self._lat_us:
            return {}
        buckets, counts = np.unique(_bucket_of(np.asarray(self._lat_us[-self._window:])),
                                    return_counts=True)
        return {int(b): int(c) for b, c in zip(buckets, counts, strict=True)}

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors,
                "error_rate": round(self.error_rate, 4), "p99_ms": round(self.p99_ms(), 3),
                "hist": {str(b): c for b, c in self.histogram().items()},
                "refused": dict(self.refused)}


class MergedStats:
    """One version's counts summed over processes, with the same face as :class:`VersionStats`
    (what :func:`decide_rollback` reads)."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.processes = 0
        self.hist: dict[int, int] = {}
        self.refused: dict[str, int] = {}

    def add(self, requests: int, errors: int, hist: dict[int, int],
            refused: dict[str, int] | None = None) -> None:
        self.requests += requests
        self.errors += errors
        self.processes += 1
        for bucket, count in hist.items():
            self.hist[bucket] = self.hist.get(bucket, 0) + count
        for code, count in (refused or {}).items():
            self.refused[code] = self.refused.get(code, 0) + int(count)

    @property
    def seen(self) -> int:
        return self.requests + sum(self.refused.values())

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def p99_ms(self) -> float:
        return _histogram_p99_ms(self.hist)


class ShadowStats:
    """A shadow's copies: sent, dropped, compared with the baseline's answer, mismatched."""

    def __init__(self) -> None:
        self.sent = 0
        self.dropped = 0
        self.compared = 0
        self.mismatched = 0
        self.errors = 0
        self.max_abs_diff = 0.0
        self.candidate = VersionStats()

    def as_dict(self) -> dict[str, Any]:
        return {"sent": self.sent, "dropped": self.dropped, "compared": self.compared,
                "mismatched": self.mismatched, "errors": self.errors,
                "max_abs_diff": self.max_abs_diff,
                "candidate_p99_ms": round(self.candidate.p99_ms(), 3)}


def service_verdict(spec: RolloutSpec, baseline: VersionStats | MergedStats,
                    candidate: VersionStats | MergedStats) -> tuple[str, str] | None:
    """(check, reason) when errors or latency condemn the candidate, else None (also while
    there is too little data)."""
    refusing = refused_only_by_candidate(spec, baseline, candidate)
    if refusing is not None:
        return "errors", refusing
    if candidate.requests < spec.min_requests or baseline.requests < spec.min_requests:
        return None
    if candidate.error_rate > baseline.error_rate + spec.max_error_rate_delta:
        return "errors", (f"error rate {candidate.error_rate:.1%} vs baseline "
                          f"{baseline.error_rate:.1%} over {candidate.requests} requests")
    c99, b99 = candidate.p99_ms(), baseline.p99_ms()
    if c99 > b99 * spec.max_p99_ratio and c99 - b99 > spec.min_p99_delta_ms:
        # The p99 of a few hundred requests is their second or third slowest: a scheduler
        # hiccup moves it. So the candidate must also be slow often enough to tell: the share
        # of its requests beyond the bound, against the 1% a same-speed version has there.
        bound_ms = max(b99 * spec.max_p99_ratio, b99 + spec.min_p99_delta_ms)
        hist = candidate.hist if isinstance(candidate, MergedStats) else candidate.histogram()
        share, n = _share_over(hist, bound_ms)
        if share > 0.01 + 4.0 * math.sqrt(0.01 * 0.99 / max(1, n)):
            return "latency", (f"p99 {c99:.2f} ms vs baseline {b99:.2f} ms: {share:.1%} of "
                               f"{n} candidate requests slower than {bound_ms:.2f} ms")
    return None


def refused_only_by_candidate(spec: RolloutSpec, baseline: VersionStats | MergedStats,
                              candidate: VersionStats | MergedStats) -> str | None:
    """Why the candidate refuses requests the baseline serves, or None: a refusal that the
    client caused comes as often to both versions (they share the traffic), so a code the
    candidate answers more often, by ``max_error_rate_delta`` and by more than chance (four
    standard errors of the difference), is the candidate's failure, not the client's."""
    n_c, n_b = candidate.seen, baseline.seen
    if n_c < spec.min_requests or n_b < spec.min_requests:
        return None
    for code in sorted(JUDGED_REFUSALS & candidate.refused.keys()):
        k_c, k_b = candidate.refused[code], baseline.refused.get(code, 0)
        p_c, p_b = k_c / n_c, k_b / n_b
        pooled = (k_c + k_b) / (n_c + n_b)
        chance = 4.0 * math.sqrt(pooled * (1 - pooled) * (1 / n_c + 1 / n_b))
        if p_c - p_b > max(spec.max_error_rate_delta, chance):
            return (f"'{code}' answers {p_c:.1%} of {n_c} requests vs baseline {p_b:.1%}: the "
                    "candidate refuses requests the baseline serves")
    return None


def _share_over(hist: dict[int, int], bound_ms: float) -> tuple[float, int]:
    """The share of a latency histogram's requests wholly beyond ``bound_ms``, and how many."""
    total = sum(hist.values())
    if not total:
        return 0.0, 0
    lowest = math.log(bound_ms * 1000.0) / _STEP  # a bucket's lower edge is exp(b * _STEP) µs
    over = sum(c for b, c in hist.items() if b >= lowest)
    return over / total, total


def decide_rollback(spec: RolloutSpec, baseline: VersionStats | MergedStats,
                    candidate: VersionStats | MergedStats) -> str | None:
    """Why errors or latency condemn the candidate, or None."""
    verdict = service_verdict(spec, baseline, candidate)
    return None if verdict is None else verdict[1]


def unservable_candidate(baseline: Any, candidate: Any, mode: str,
                         v2_only: bool = False) -> str | None:
    """Why a candidate (a version's ``ModelMetadata``) cannot serve the requests its baseline
    serves, or None: checked before a rollout starts, since every request such a candidate
    got would be refused (400), and refusals look like the client's mistakes."""
    name, b, c = baseline.name, baseline.version, candidate.version
    b_inputs = sorted(t.name for t in baseline.inputs)
    c_inputs = sorted(t.name for t in candidate.inputs)
    if b_inputs and c_inputs and b_inputs != c_inputs:
        return (f"version {c} of '{name}' takes the inputs {c_inputs}, version {b} takes "
                f"{b_inputs}: requests name the baseline's inputs, so the candidate would "
                "refuse them; a model with other inputs is a new model (or a version clients "
                "move to together), not a canary")
    if mode != "canary" or v2_only or not baseline.feature_names:
        return None  # a shadow replays the baseline's arrays; V2 needs no feature names
    if not candidate.feature_names:
        why = "records no feature_names"
    elif len(candidate.inputs) != 1 or len(candidate.inputs[0].shape) != 2:
        why = "does not take one 2-D input [rows, features]"
    else:
        return None
    return (f"version {c} of '{name}' {why}, while version {b} serves /v1 with "
            f"{len(baseline.feature_names)} feature names: the candidate cannot assemble a /v1 "
            "request's input, and every /v1 request sent to it would answer 400; add it again "
            f"with --feature-names (version {b}'s: `redline models show -m {name}`), or pass "
            f"--v2-only when '{name}' serves no /v1 requests")


def sticky_share(entities: Any) -> float:
    """A stable number in [0, 100) for an entity (its keys and ids), the same in every process."""
    row = entities[0] if isinstance(entities, list) and entities else entities
    text = json.dumps(row, sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest()) % 10000 / 100


LabelSource = Callable[[str, str], Any]  # (model, version) -> its QualityMonitor, or None


class RolloutController:
    """Routes default-version requests, counts per version, shadows, and rolls back.

    Installed on a server with :func:`install`: it becomes the registry's ``router`` and, while
    a rollout is active, one of the server's request observers. Only then: a second observer
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
        self._shadow_tasks: set[asyncio.Task[None]] = set()
        self._random = random.Random()
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
                    handle.shadowed = True  # every request's arrays, not monitoring's sample
                    self._keeping.add(handle)

    def _release_io(self) -> None:
        """Handles no longer in a rollout stop keeping each request's arrays."""
        wanted = {(s.model, v) for s in self.active.values()
                  for v in ((s.baseline,) if s.mode == "shadow" else (s.baseline, s.candidate))}
        for handle in list(self._keeping):
            if (handle.name, handle.version) not in wanted:
                handle.shadowed = False
                self._keeping.discard(handle)

    def _write_stats(self) -> None:
        models = {m for m, _ in self.stats} | set(self.shadow) | {m for m, _ in self.answers}
        doc = {"pid": os.getpid(), "time": time.time(),
               "started": {m: self._started[m] for m in models if m in self._started},
               "versions": {f"{m}:{v}": s.as_dict() for (m, v), s in self.stats.items()},
               "answers": {f"{m}:{v}": a.as_dict() for (m, v), a in self.answers.items()},
               "shadow": {m: s.as_dict() for m, s in self.shadow.items()},
               "labels": self.label_losses}
        folder = self.file.stats_dir
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{self.instance}.tmp"
            tmp.write_text(json.dumps(doc))
            tmp.replace(folder / f"{self.instance}.json")

    def _peer_stats(self) -> dict[tuple[str, int], MergedStats]:
        """The other processes' counts for the rollouts running now (their files, re-read at
        most twice a second; a file of an older rollout of the same model is ignored)."""
        now = time.monotonic()
        if now - self._peers_read < 0.5:
            return self._peers
        self._peers_read = now
        peers: dict[tuple[str, int], MergedStats] = {}
        answers: dict[tuple[str, int], MergedAnswers] = {}
        shadow: dict[str, tuple[int, int]] = {}
        folder = self.file.stats_dir
        try:
            paths = [p for p in folder.glob("*.json") if p.stem != self.instance]
        except OSError:
            paths = []
        for path in paths:
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced, or gone: the next read will have it
            current = _current_models(doc, self.active)
            for key, s in doc.get("versions", {}).items():
                model, _, version = key.rpartition(":")
                if model in current:
                    merged = peers.setdefault((model, int(version)), MergedStats())
                    merged.add(int(s["requests"]), int(s["errors"]),
                               {int(b): int(c) for b, c in s.get("hist", {}).items()},
                               s.get("refused"))
            for key, part in doc.get("answers", {}).items():
                model, _, version = key.rpartition(":")
                if model in current:
                    answers.setdefault((model, int(version)), MergedAnswers()).add_doc(part)
            for model, s in doc.get("shadow", {}).items():
                if model in current:
                    compared, mismatched = shadow.get(model, (0, 0))
                    shadow[model] = (compared + int(s.get("compared", 0)),
                                     mismatched + int(s.get("mismatched", 0)))
        self._peers, self._peer_answers, self._peer_shadow = peers, answers, shadow
        return peers

    def merged(self, model: str, version: int) -> MergedStats:
        """This process's live counts plus every other process's last written ones."""
        out = MergedStats()
        own = self.stats.get((model, version))
        if own is not None:
            out.add(own.requests, own.errors, own.histogram(), own.refused)
        peer = self._peer_stats().get((model, version))
        if peer is not None:
            out.requests += peer.requests
            out.errors += peer.errors
            out.processes += peer.processes
            for bucket, count in peer.hist.items():
                out.hist[bucket] = out.hist.get(bucket, 0) + count
            for code, count in peer.refused.items():
                out.refused[code] = out.refused.get(code, 0) + count
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

    def request_finished(self, record: Any) -> None:
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
        outputs = getattr(record, "outputs", None)
        if status == "ok" and outputs is not None:
            self._answer_sample(spec.model, version).add(outputs)
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
        """The loss of each version over the labels joined since its rollout began (a shared
        label join is read on a worker thread, never on the loop)."""
        assert self.labels is not None
        for spec in specs:
            pairs: dict[int, np.ndarray] = {}
            for version in (spec.baseline, spec.candidate):
                quality = self.labels(spec.model, str(version))
                mark_key = (spec.model, version, spec.started)
                if quality is None:
                    # No monitor yet: whatever it joins comes after the start.
                    self._joined_at.setdefault(mark_key, 0)
                    pairs[version] = np.zeros((0, 2))
                    continue
                try:
                    snap = await asyncio.to_thread(quality.state.snapshot)
                except Exception:  # noqa: BLE001 - a shared join down: judged next time
                    return
                mark = self._joined_at.setdefault(mark_key, snap.joined)
                fresh = min(max(0, snap.joined - mark), int(snap.labelled.shape[0]))
                pairs[version] = snap.labelled[snap.labelled.shape[0] - fresh:] if fresh \
                    else np.zeros((0, 2))
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
        stats = self.shadow.setdefault(spec.model, ShadowStats())
        if spec.percent < 100 and self._random.random() * 100 >= spec.percent:
            return
        if len(self._shadow_tasks) >= spec.shadow_max_in_flight:
            stats.dropped += 1
            return
        try:
            candidate = self.registry.get(spec.model, str(spec.candidate))
            loop = asyncio.get_running_loop()
        except Exception:  # noqa: BLE001 - not loaded yet, or no loop: nothing to shadow
            return
        stats.sent += 1
        task = loop.create_task(self._shadow(spec, candidate, record.inputs, record.outputs,
                                             stats))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _shadow(self, spec: RolloutSpec, candidate: Any, inputs: Any, primary: Any,
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


def _current_models(doc: dict[str, Any], rollouts: dict[str, RolloutSpec]) -> set[str]:
    """The models whose counts in a stats file belong to the rollout running now (a file
    written during an earlier rollout of the same model carries that one's start)."""
    started = doc.get("started", {})
    return {m for m, spec in rollouts.items() if started.get(m) == spec.started}


def rollout_path(settings: Any) -> Path:
    """``scaling.rollout_file``; left at its default, it lives in the project folder."""
    path = settings.scaling.rollout_file
    return Path(path) if path else Path(settings.project) / "rollout.json"


def install(server: RedlineServer) -> RolloutController:
    """Make a server follow ``scaling.rollout_file`` (router + observer), its rollbacks
    counted in the server's metrics and judged on its labels when monitoring is on."""
    monitor = None
    if server.monitor is not None:
        from redline.monitoring import ServerMonitor

        if isinstance(server.monitor, ServerMonitor):
            monitor = server.monitor
    controller = RolloutController(server.registry, rollout_path(server.settings),
                                   labels=monitor.label_joins if monitor is not None else None)
    server.registry.router = controller.route
    controller.observe(server.observers)  # an observer while a rollout is active
    if monitor is not None:
        monitor.count_rollbacks(controller)  # redline_rollout_rollbacks_total
    server.attach(RolloutTicker(controller))
    return controller


class RolloutTicker:
    """Refreshes a controller once a second while its server serves, requests or not.

    Requests refresh it too (``route``), but a worker that has gone idle would otherwise never
    write its last counts, and ``rollout status`` (which reads every process's stats file, and
    drops files older than 30 s) would show stale or vanished counts for a quiet pool."""

    def __init__(self, controller: RolloutController, every_s: float = 1.0) -> None:
        self.controller = controller
        self.every_s = every_s

    async def models_loaded(self) -> None:
        return None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                self.controller.refresh()
            except Exception as exc:  # noqa: BLE001 - the next tick tries again
                log.warning("rollout refresh failed: %s: %s", type(exc).__name__, exc)

    def close(self) -> None:
        return None


def aggregate_stats(file: RolloutFile, max_age_s: float = 30.0,
                    rollouts: dict[str, RolloutSpec] | None = None) -> dict[str, Any]:
    """Per-version counts of each model's latest rollout, added up over every process that
    wrote recently (a file's counts of an earlier rollout of the same model are left out),
    and each rollout's answers compared."""
    if rollouts is None:
        rollouts = file.read()
    versions: dict[str, dict[str, Any]] = {}
    shadow: dict[str, dict[str, Any]] = {}
    labels: dict[str, dict[str, dict[str, Any]]] = {}
    hists: dict[str, dict[int, int]] = {}
    answers: dict[str, MergedAnswers] = {}
    processes = 0
    now = time.time()
    for path in sorted(file.stats_dir.glob("*.json")) if file.stats_dir.exists() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if now - doc.get("time", 0) > max_age_s:
            continue
        processes += 1
        current = _current_models(doc, rollouts)
        for key, s in doc.get("versions", {}).items():
            if key.rpartition(":")[0] not in current:
                continue
            into = versions.setdefault(key, {"requests": 0, "errors": 0, "p99_ms": 0.0,
                                             "refused": {}})
            into["requests"] += s["requests"]
            into["errors"] += s["errors"]
            for code, count in s.get("refused", {}).items():
                into["refused"][code] = into["refused"].get(code, 0) + int(count)
            into["p99_ms"] = max(into["p99_ms"], s["p99_ms"])  # worst process, unless merged
            hist = hists.setdefault(key, {})
            for bucket, count in s.get("hist", {}).items():
                hist[int(bucket)] = hist.get(int(bucket), 0) + int(count)
        for key, part in doc.get("answers", {}).items():
            if key.rpartition(":")[0] in current:
                answers.setdefault(key, MergedAnswers()).add_doc(part)
        for key, s in doc.get("shadow", {}).items():
            if key not in current:
                continue
            into = shadow.setdefault(key, {})
            for k, v in s.items():
                into[k] = max(into.get(k, 0), v) if k in ("max_abs_diff", "candidate_p99_ms") \
                    else into.get(k, 0) + v
        for model, per_version in doc.get("labels", {}).items():
            if model in current:  # labels are judged per process: the largest sample shows
                for version, loss in per_version.items():
                    shown = labels.setdefault(model, {}).get(version)
                    if shown is None or loss["labelled"] > shown["labelled"]:
                        labels[model][version] = loss
    for key, s in versions.items():
        s["error_rate"] = round(s["errors"] / s["requests"], 4) if s["requests"] else 0.0
        if hists.get(key):
            s["p99_ms"] = round(_histogram_p99_ms(hists[key]), 3)  # of the merged latencies
    compared: dict[str, Any] = {}
    for name, spec in rollouts.items():
        base = answers.get(f"{name}:{spec.baseline}")
        cand = answers.get(f"{name}:{spec.candidate}")
        if base is not None and cand is not None:
            compared[name] = compare_answers(spec, base, cand)
    return {"processes": processes, "versions": versions, "shadow": shadow,
            "answers": compared, "labels": labels}
