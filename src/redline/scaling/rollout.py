"""Canary and shadow rollouts of a candidate model version, with automatic rollback.

The rollout of a model is a small JSON document in ``scaling.rollout_file`` (written by
``redline rollout start|promote|abort``). Every server process polls it (a ``stat`` at most
twice a second, from the request path) so all workers and replicas sharing the project folder
follow the same rollout, and a rollback decided by one is seen by all.

- **canary**: ``percent`` of the model's default-version traffic goes to the candidate, chosen
  at random per request, or *sticky* by entity key for ``/v1`` (the same entity always sees the
  same version: a stable hash of its keys). Each process counts per version: requests, server
  errors (client mistakes such as invalid input do not count) and latency. Once both versions
  have ``min_requests``, the candidate is rolled back when its error rate exceeds the baseline's
  by ``max_error_rate_delta`` or its p99 exceeds the baseline's by ``max_p99_ratio`` (and by at
  least ``min_p99_delta_ms``, so a sub-millisecond jitter is not a regression).
- **shadow**: every (or ``percent`` of) baseline request is run again on the candidate after
  the response is done, off the critical path (its own ORT thread, bounded concurrency: when
  more than ``shadow_max_in_flight`` are running a copy is dropped, never queued). Outputs are
  compared (``numpy.allclose``) and latencies recorded; the response never changes.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from redline.errors import InvalidInput, NotFound

log = logging.getLogger("redline.scaling")

# Request outcomes that are the client's doing: they never count against a version.
CLIENT_ERRORS = frozenset({"invalid_input", "payload_too_large", "not_found", "model_not_found",
                           "version_not_found", "feature_not_found", "unauthorized",
                           "overloaded"})
ACTIVE = "running"


@dataclass
class RolloutSpec:
    """One model's rollout, as stored in the rollout file."""

    model: str
    baseline: int
    candidate: int
    mode: str = "canary"  # canary | shadow
    percent: float = 10.0
    sticky: bool = False
    min_requests: int = 200
    max_error_rate_delta: float = 0.01
    max_p99_ratio: float = 1.5
    min_p99_delta_ms: float = 1.0
    shadow_max_in_flight: int = 4
    state: str = ACTIVE  # running | promoted | aborted | rolled_back
    reason: str = ""
    started: float = field(default_factory=time.time)

    def check(self) -> None:
        if self.mode not in ("canary", "shadow"):
            raise InvalidInput(f"rollout mode must be canary or shadow, got {self.mode!r}")
        if not 0 < self.percent <= 100:
            raise InvalidInput(f"--percent must be in (0, 100], got {self.percent}")
        if self.candidate == self.baseline:
            raise InvalidInput(f"candidate version {self.candidate} is already the baseline")


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
    """Requests, server errors and recent latencies of one model version in this process."""

    def __init__(self, window: int = 4096) -> None:
        self.requests = 0
        self.errors = 0
        self._lat_us: list[float] = []
        self._window = window

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
                "hist": {str(b): c for b, c in self.histogram().items()}}


class MergedStats:
    """One version's counts summed over processes, with the same face as :class:`VersionStats`
    (what :func:`decide_rollback` reads)."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.processes = 0
        self.hist: dict[int, int] = {}

    def add(self, requests: int, errors: int, hist: dict[int, int]) -> None:
        self.requests += requests
        self.errors += errors
        self.processes += 1
        for bucket, count in hist.items():
            self.hist[bucket] = self.hist.get(bucket, 0) + count

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def p99_ms(self) -> float:
        return _histogram_p99_ms(self.hist)


class ShadowStats:
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


def decide_rollback(spec: RolloutSpec, baseline: VersionStats | MergedStats,
                    candidate: VersionStats | MergedStats) -> str | None:
    """Why the candidate must be rolled back, or None (also None while there is too little data)."""
    if candidate.requests < spec.min_requests or baseline.requests < spec.min_requests:
        return None
    if candidate.error_rate > baseline.error_rate + spec.max_error_rate_delta:
        return (f"error rate {candidate.error_rate:.1%} vs baseline {baseline.error_rate:.1%} "
                f"over {candidate.requests} requests")
    c99, b99 = candidate.p99_ms(), baseline.p99_ms()
    if c99 > b99 * spec.max_p99_ratio and c99 - b99 > spec.min_p99_delta_ms:
        return f"p99 {c99:.2f} ms vs baseline {b99:.2f} ms over {candidate.requests} requests"
    return None


def sticky_share(entities: Any) -> float:
    """A stable number in [0, 100) for an entity (its keys and ids), the same in every process."""
    row = entities[0] if isinstance(entities, list) and entities else entities
    text = json.dumps(row, sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest()) % 10000 / 100


class RolloutController:
    """Routes default-version requests, counts per version, shadows, and rolls back.

    Installed on a server with :func:`install`: it becomes the registry's ``router`` and, while
    a rollout is active, one of the server's request observers. Only then: a second observer
    makes every request keep its record for it, which costs the monitored common request the
    flat stage times it leaves when the monitor is the one observer (``serving/stages.py``).
    """

    def __init__(self, registry: Any, path: str | os.PathLike[str],
                 instance: str | None = None) -> None:
        self.registry = registry
        self.file = RolloutFile(path)
        self.instance = instance or str(os.getpid())  # names this process's stats file
        self._peers: dict[tuple[str, int], MergedStats] = {}
        self._peers_read = float("-inf")
        self.active: dict[str, RolloutSpec] = {}
        self.stats: dict[tuple[str, int], VersionStats] = {}
        self.shadow: dict[str, ShadowStats] = {}
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
                    for key in [k for k in self.stats if k[0] == name]:
                        del self.stats[key]
                self._keep_io(spec)
            self._release_io()
            self._watch_requests()
        if now - self._written > 1.0 and (self.stats or self.shadow):
            self._written = now
            self._write_stats()

    def _keep_io(self, spec: RolloutSpec) -> None:
        if spec.mode != "shadow":
            return
        with contextlib.suppress(Exception):
            handle = self.registry.get(spec.model, str(spec.baseline))
            handle.shadowed = True  # every request's arrays, not monitoring's sample
            self._keeping.add(handle)

    def _release_io(self) -> None:
        """Handles no longer shadowed stop keeping each request's arrays."""
        wanted = {(s.model, s.baseline) for s in self.active.values() if s.mode == "shadow"}
        for handle in list(self._keeping):
            if (handle.name, handle.version) not in wanted:
                handle.shadowed = False
                self._keeping.discard(handle)

    def _write_stats(self) -> None:
        doc = {"pid": os.getpid(), "time": time.time(),
               "started": {m: self._started[m] for m in {m for m, _ in self.stats}
                           if m in self._started},
               "versions": {f"{m}:{v}": s.as_dict() for (m, v), s in self.stats.items()},
               "shadow": {m: s.as_dict() for m, s in self.shadow.items()}}
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
            started = doc.get("started", {})
            for key, s in doc.get("versions", {}).items():
                model, _, version = key.rpartition(":")
                spec = self.active.get(model)
                if spec is None or started.get(model) != spec.started:
                    continue
                merged = peers.setdefault((model, int(version)), MergedStats())
                merged.add(int(s["requests"]), int(s["errors"]),
                           {int(b): int(c) for b, c in s.get("hist", {}).items()})
        self._peers = peers
        return peers

    def merged(self, model: str, version: int) -> MergedStats:
        """This process's live counts plus every other process's last written ones."""
        out = MergedStats()
        own = self.stats.get((model, version))
        if own is not None:
            out.add(own.requests, own.errors, own.histogram())
        peer = self._peer_stats().get((model, version))
        if peer is not None:
            out.requests += peer.requests
            out.errors += peer.errors
            out.processes += peer.processes
            for bucket, count in peer.hist.items():
                out.hist[bucket] = out.hist.get(bucket, 0) + count
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
        if status in CLIENT_ERRORS:
            return
        stats = self.stats.setdefault((spec.model, version), VersionStats())
        stats.add(status == "ok", record.total_us)
        if spec.mode == "shadow":
            if version == spec.baseline and status == "ok" and record.inputs is not None:
                self._start_shadow(spec, record)
            return
        if version == spec.candidate and stats.requests % 10 == 0:
            # Decided on the sums over every worker (and replica sharing the project folder),
            # so N workers take one decision on N times the traffic, not N on a share each.
            why = decide_rollback(spec, self.merged(spec.model, spec.baseline),
                                  self.merged(spec.model, spec.candidate))
            if why is not None:
                self.roll_back(spec, why)

    def roll_back(self, spec: RolloutSpec, why: str) -> None:
        log.warning("rollout of %s v%s rolled back: %s", spec.model, spec.candidate, why)
        self.active.pop(spec.model, None)
        self._release_io()
        self._watch_requests()
        try:
            self.file.update(spec.model, state="rolled_back", reason=why)
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
        task = loop.create_task(self._shadow(candidate, record.inputs, record.outputs, stats))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _shadow(self, candidate: Any, inputs: Any, primary: Any, stats: ShadowStats
                      ) -> None:
        await asyncio.sleep(0)  # after the primary's response has gone
        start = time.perf_counter_ns()
        try:
            outputs = await candidate.infer(inputs, None, validate=False)
        except Exception:  # noqa: BLE001 - a failing candidate is what shadowing is for
            stats.errors += 1
            stats.candidate.add(False, (time.perf_counter_ns() - start) / 1000)
            return
        stats.candidate.add(True, (time.perf_counter_ns() - start) / 1000)
        stats.compared += 1
        same = True
        for name, value in (primary or {}).items():
            other = outputs.get(name)
            if other is None or np.shape(other) != np.shape(value):
                same = False
                continue
            if np.issubdtype(np.asarray(value).dtype, np.number):
                diff = float(np.max(np.abs(np.asarray(other, np.float64)
                                           - np.asarray(value, np.float64)), initial=0.0))
                stats.max_abs_diff = max(stats.max_abs_diff, diff)
                same = same and bool(np.allclose(other, value, rtol=1e-4, atol=1e-5))
            else:
                same = same and bool(np.array_equal(other, value))
        if not same:
            stats.mismatched += 1

    def report(self) -> dict[str, Any]:
        return {"rollouts": {n: asdict(s) for n, s in self.active.items()},
                "versions": {f"{m}:{v}": s.as_dict() for (m, v), s in self.stats.items()},
                "shadow": {m: s.as_dict() for m, s in self.shadow.items()}}


def rollout_path(settings: Any) -> Path:
    """``scaling.rollout_file``; left at its default, it lives in the project folder."""
    path = settings.scaling.rollout_file
    return Path(path) if path else Path(settings.project) / "rollout.json"


def install(server: Any) -> RolloutController:
    """Make a server follow ``scaling.rollout_file`` (router + observer)."""
    controller = RolloutController(server.registry, rollout_path(server.settings))
    server.registry.router = controller.route
    controller.observe(server.observers)  # an observer while a rollout is active
    server.rollouts = controller
    return controller


def aggregate_stats(file: RolloutFile, max_age_s: float = 30.0) -> dict[str, Any]:
    """Per-version counts added up over every process that wrote recently."""
    versions: dict[str, dict[str, Any]] = {}
    shadow: dict[str, dict[str, Any]] = {}
    hists: dict[str, dict[int, int]] = {}
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
        for key, s in doc.get("versions", {}).items():
            into = versions.setdefault(key, {"requests": 0, "errors": 0, "p99_ms": 0.0})
            into["requests"] += s["requests"]
            into["errors"] += s["errors"]
            into["p99_ms"] = max(into["p99_ms"], s["p99_ms"])  # worst process, unless merged
            hist = hists.setdefault(key, {})
            for bucket, count in s.get("hist", {}).items():
                hist[int(bucket)] = hist.get(int(bucket), 0) + int(count)
        for key, s in doc.get("shadow", {}).items():
            into = shadow.setdefault(key, {})
            for k, v in s.items():
                into[k] = max(into.get(k, 0), v) if k in ("max_abs_diff", "candidate_p99_ms") \
                    else into.get(k, 0) + v
    for key, s in versions.items():
        s["error_rate"] = round(s["errors"] / s["requests"], 4) if s["requests"] else 0.0
        if hists.get(key):
            s["p99_ms"] = round(_histogram_p99_ms(hists[key]), 3)  # of the merged latencies
    return {"processes": processes, "versions": versions, "shadow": shadow}
