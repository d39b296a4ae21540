"""Where the label join and the quality windows live: this process, a SQLite file, or Redis.

A prediction waits for its label under its request id (bounded by ``join_capacity`` and
``join_ttl_s``: the oldest go first, and their ids are remembered, ids only and as many, so a
label that comes after its prediction left is counted *late*, not mistaken for an unknown one).
The ids of joined predictions are remembered the same way (as many): a second label for one of
them is a *duplicate*; the first label stands and the pair is counted once.
A joined (score, label) pair goes into a capped window, and every prediction's score into a
capped window of recent scores (the CBPE estimate); :class:`~redline.monitoring.quality.
QualityMonitor` computes its figures from those windows.

One :class:`JoinBackend` per server process hands out one :class:`JoinState` per model version:

- ``memory`` (:class:`MemoryJoin`): this process only; right for one worker, and what a pool
  must not use (a label reaches any worker, most often not the one holding its prediction);
- ``sqlite`` (``joinstore_sqlite``): one WAL file that every worker of one host shares, with no
  server to run; ``redline serve --workers N`` puts it in the pool's state directory;
- ``redis`` (``joinstore_redis``): shared by every worker and every replica on every host.

A shared backend also holds a lease (``leads``): the one worker holding it sends the alert
webhook, so a pool does not send each alert once per worker.

Predictions reach a shared backend in batches from the monitoring tick (``flush``), never from
a request. A shared backend that cannot be reached raises ``StoreUnavailable`` (a 503 for the
label and quality routes); the predictions of that time wait in memory, bounded, and are written
when it is back.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from redline.errors import ConfigError

JOINED, LATE, UNKNOWN, DUPLICATE = 1, 2, 0, 3  # the outcome of one label in one version


@dataclass
class JoinSnapshot:
    """What the quality figures are computed from, and the join's counters."""

    labelled: np.ndarray  # (n, 2): score, label
    recent: np.ndarray  # scores of recent predictions, labelled or not
    pending: int  # predictions waiting for a label
    evicted: int  # predictions that left unlabelled (capacity or TTL)
    joined: int
    late: int  # labels that came after their prediction had left


class JoinState(Protocol):
    """The join and quality windows of one model version."""

    def predicted(self, request_ids: list[str], scores: np.ndarray) -> None: ...

    def join(self, request_ids: list[str], labels: list[float]) -> list[int]: ...

    def count_late(self, n: int) -> None: ...

    def label_score(self, score: float, label: float) -> None: ...

    def snapshot(self) -> JoinSnapshot: ...


class JoinBackend(Protocol):
    """Hands out the per-version states; ``shared`` when other processes see the same join."""

    kind: str
    shared: bool

    def state(self, model: str, version: str, capacity: int, ttl_s: float,
              window: int) -> JoinState: ...

    def flush(self) -> None: ...

    def count_unmatched(self, model: str | None, n: int) -> None: ...

    def unmatched(self, model: str) -> int: ...

    def leads(self, name: str, ttl_s: float) -> bool: ...


# ---------------------------------------------------------------------- this process
class MemoryJoin:
    """One version's join in this process's memory (one worker; what the tests drive)."""

    def __init__(self, capacity: int, ttl_s: float, window: int) -> None:
        self.capacity, self.ttl_s = capacity, ttl_s
        self._pending: OrderedDict[str, tuple[float, float]] = OrderedDict()  # id -> (t, score)
        self._gone: OrderedDict[str, None] = OrderedDict()  # ids that left unlabelled
        self._done: OrderedDict[str, None] = OrderedDict()  # ids labelled already
        self._labelled: deque[tuple[float, float]] = deque(maxlen=window)
        self._recent: deque[float] = deque(maxlen=window)
        self.joined = self.evicted = self.late = 0
        self._lock = threading.Lock()

    def predicted(self, request_ids: list[str], scores: np.ndarray) -> None:
        now = time.monotonic()
        with self._lock:
            pending = self._pending
            for rid, score in zip(request_ids, scores.tolist(), strict=False):
                self._recent.append(score)
                if not rid:
                    continue
                pending[rid] = (now, score)
                pending.move_to_end(rid)
            cutoff = now - self.ttl_s
            while pending and (len(pending) > self.capacity
                               or next(iter(pending.values()))[0] < cutoff):
                self._leave(pending.popitem(last=False)[0])

    def _leave(self, rid: str) -> None:
        self.evicted += 1
        self._gone[rid] = None
        if len(self._gone) > self.capacity:
            self._gone.popitem(last=False)

    def join(self, request_ids: list[str], labels: list[float]) -> list[int]:
        out = []
        with self._lock:
            for rid, label in zip(request_ids, labels, strict=True):
                entry = self._pending.pop(rid, None)
                if entry is not None:
                    self._labelled.append((entry[1], float(label)))
                    self.joined += 1
                    out.append(JOINED)
                    self._done[rid] = None
                    if len(self._done) > self.capacity:
                        self._done.popitem(last=False)
                elif rid in self._done:
                    out.append(DUPLICATE)
                elif rid in self._gone:
                    out.append(LATE)
                else:
                    out.append(UNKNOWN)
        return out

    def count_late(self, n: int) -> None:
        with self._lock:
            self.late += n

    def label_score(self, score: float, label: float) -> None:
        with self._lock:
            self._labelled.append((float(score), float(label)))
            self.joined += 1

    def snapshot(self) -> JoinSnapshot:
        with self._lock:
            labelled = np.asarray(self._labelled, dtype=np.float64).reshape(-1, 2)
            recent = np.asarray(self._recent, dtype=np.float64)
            return JoinSnapshot(labelled, recent, len(self._pending), self.evicted, self.joined,
                                self.late)


class MemoryBackend:
    """Every version's join in this process."""

    kind = "memory"
    shared = False

    def __init__(self) -> None:
        self._unmatched: dict[str, int] = {}

    def state(self, model: str, version: str, capacity: int, ttl_s: float,
              window: int) -> MemoryJoin:
        return MemoryJoin(capacity, ttl_s, window)

    def flush(self) -> None:
        pass

    def count_unmatched(self, model: str | None, n: int) -> None:
        self._unmatched[model or ""] = self._unmatched.get(model or "", 0) + n

    def unmatched(self, model: str) -> int:
        return self._unmatched.get(model, 0) + self._unmatched.get("", 0)

    def leads(self, name: str, ttl_s: float) -> bool:
        return True  # the only process that sees this join


@dataclass
class JoinOutcome:
    """What became of a batch of labels."""

    joined: int
    unmatched: list[str]  # ids no version knows
    late: int  # their predictions had left unlabelled
    duplicate: int = 0  # their predictions had a label already (the first one stands)


def join_labels(states: list[Any], request_ids: list[str], labels: list[float]
                ) -> JoinOutcome:
    """Join labels against the versions in ``states`` (the first version holding an id takes
    its label). A label no version holds is a *duplicate* when a version joined its prediction
    already, *late* when a version remembers its prediction leaving (counted there), else
    unmatched."""
    todo = list(range(len(request_ids)))
    late_at: dict[int, Any] = {}
    duplicate: set[int] = set()
    joined = 0
    for state in states:
        if not todo:
            break
        outcome = state.join([request_ids[i] for i in todo], [labels[i] for i in todo])
        rest = []
        for i, o in zip(todo, outcome, strict=True):
            if o == JOINED:
                joined += 1
                late_at.pop(i, None)
                duplicate.discard(i)
            else:
                rest.append(i)
                if o == LATE:
                    late_at.setdefault(i, state)
                elif o == DUPLICATE:
                    duplicate.add(i)
        todo = rest
    for i in duplicate:
        late_at.pop(i, None)  # labelled in one version: not late because another let it go
    per_state: dict[int, tuple[Any, int]] = {}
    for state in late_at.values():
        per_state[id(state)] = (state, per_state.get(id(state), (state, 0))[1] + 1)
    for state, n in per_state.values():
        state.count_late(n)
    unmatched = [request_ids[i] for i in todo if i not in late_at and i not in duplicate]
    return JoinOutcome(joined, unmatched, len(late_at), len(duplicate))


def join_backend(settings: Any) -> JoinBackend:
    """The backend ``settings`` name: ``monitoring.quality_store`` (auto: Redis when the
    features are in Redis, so replicas share it; else the SQLite file when one is set, as a
    pool of workers does; else this process)."""
    mon = settings.monitoring
    kind = join_backend_kind(settings)
    if kind == "redis":
        from redline.monitoring.joinstore_redis import RedisBackend

        return RedisBackend(settings.features.redis_url, settings.features.redis_cluster,
                            mon.quality_store_timeout_ms)
    if kind == "sqlite":
        from redline.monitoring.joinstore_sqlite import SqliteBackend

        return SqliteBackend(mon.quality_path, mon.quality_store_timeout_ms)
    return MemoryBackend()


def join_backend_kind(settings: Any) -> str:
    """``memory``, ``sqlite`` or ``redis``: which backend :func:`join_backend` would build."""
    mon = settings.monitoring
    kind = mon.quality_store
    if kind not in ("auto", "memory", "sqlite", "redis"):
        raise ConfigError(f"monitoring.quality_store must be auto, memory, sqlite or redis, "
                          f"got {kind!r}")
    if kind == "sqlite" and not mon.quality_path:
        raise ConfigError("monitoring.quality_store: sqlite needs monitoring.quality_path (the "
                          "file every worker shares)")
    if kind == "auto":
        if settings.features.store == "redis":
            return "redis"
        return "sqlite" if mon.quality_path else "memory"
    return str(kind)
