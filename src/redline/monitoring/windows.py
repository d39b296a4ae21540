"""Where each request's inputs and outputs go after it is answered: drift, quality, review.

Nothing here runs on the request path: the monitor folds finished records in batches
(``fold``: of the records the model itself answered, only what the windows read -- model,
version, request id, the input and output arrays -- goes into a bounded deque, flat, in pieces
of ``PIECE`` records), and ``absorb`` does the numpy work for many requests at once on a worker
thread. Keeping five references rather than the record lets the record (several objects the
garbage collector tracks: itself, its span list, its spans) die at the fold instead of living
until the tick and being walked by the collections meanwhile; a piece is one tracked list whose
items (strings, dicts of numpy arrays) the collector does not track. The deque is bounded: when
ticks fall behind under a flood, the oldest pieces are dropped rather than memory growing. At
most ``monitoring.window_rows_per_s`` records a second (per server) reach the windows: beyond
it ``absorb`` takes a uniform sample of the requests without a request id (every request with
one is kept: a label may come for it). A drift window of 5,000 rows then spans seconds of
traffic rather than a fraction of one, at a bounded cost per second.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.errors import RedlineError
from redline.monitoring.drift import DriftMonitor
from redline.monitoring.handoff import yield_to_loop
from redline.monitoring.joinstore import JoinBackend, JoinOutcome, MemoryBackend, join_labels
from redline.monitoring.quality import QualityMonitor
from redline.monitoring.review import ReviewQueue

if TYPE_CHECKING:
    from redline.config.settings import MonitoringSettings
    from redline.serving.stages import RequestRecord

log = logging.getLogger("redline.monitoring")

ABSORB_SLICE = 32  # records absorbed (and freed) between two hand-overs to the loop (~0.5 ms)
PIECE = 16  # records per pending piece (one list the collector tracks, instead of ~9 a record)
FIELDS = 5  # a record in a piece: model, version, request id, inputs, outputs

MetadataLookup = Callable[[str, str], Any]  # (model, version) -> ModelMetadata | None
FolderLookup = Callable[[str, str], Path | None]  # (model, version) -> the version's folder


class ModelWindows:
    """The request observer for drift, quality and review, and the monitors per version."""

    def __init__(self, lookup: MetadataLookup, settings: MonitoringSettings, review: ReviewQueue,
                 max_pending: int = 50_000, join: JoinBackend | None = None,
                 folder: FolderLookup | None = None) -> None:
        self.lookup = lookup
        self.folder = folder  # where a version's calibrated drift thresholds are kept
        self.settings = settings  # MonitoringSettings
        self.review = review
        self.join: JoinBackend = join if join is not None else MemoryBackend()
        self.unsent_error: str | None = None  # why the last flush to a shared join failed
        # Pieces of at most PIECE records, FIELDS items each, flat (see the module's docstring).
        self._pending: deque[list[Any]] = deque(maxlen=max(1, max_pending // PIECE))
        self.drift: dict[tuple[str, str], DriftMonitor] = {}
        self.quality: dict[tuple[str, str], QualityMonitor] = {}
        self._meta: dict[tuple[str, str], Any] = {}
        self.records_seen = 0
        self.sampled_out = 0  # records left out of the windows by the rate (no request id)
        self.rows_per_s = float(settings.window_rows_per_s or 0)
        self._last_absorb = time.monotonic()
        self._lock = threading.Lock()  # absorb runs on the tick's thread and in routes

    def request_finished(self, record: RequestRecord) -> None:
        self.fold((record,))

    def fold(self, records: Iterable[RequestRecord]) -> None:
        # Only what the model itself answered: a fallback's rows are not this model's inputs.
        append = self._pending.append
        piece: list[Any] = []
        for r in records:
            if r.status == "ok" and r.path == "primary" and (
                    r.inputs is not None or r.outputs is not None):
                piece += (r.model, r.version, r.request_id, r.inputs, r.outputs)
                if len(piece) == PIECE * FIELDS:
                    append(piece)
                    piece = []
        if piece:
            append(piece)

    def fold_samples(self, model: str, version: str, samples: list[Any]) -> None:
        """Sampled arrays of one version's common requests (``inputs, outputs, ...`` from its
        flat stage-times buffer): ok, primary, no request id, as the serving side sends."""
        append = self._pending.append
        piece: list[Any] = []
        for i in range(0, len(samples) - 1, 2):
            piece += (model, version, "", samples[i], samples[i + 1])
            if len(piece) == PIECE * FIELDS:
                append(piece)
                piece = []
        if piece:
            append(piece)

    # ------------------------------------------------------------------ the tick
    def absorb(self) -> int:
        """Move pending records into the windows (and their predictions into a shared join);
        returns how many were taken."""
        with self._lock:
            taken = self._absorb()
            self._flush()
            return taken

    def _flush(self) -> None:
        """New predictions into a shared join; when it is down they wait, bounded, for the next
        tick (and a label route answers 503 meanwhile)."""
        if not self.join.shared:
            return
        try:
            self.join.flush()
            self.unsent_error = None
        except RedlineError as exc:
            if self.unsent_error is None:
                log.warning("label join: predictions wait in memory: %s", exc.message)
            self.unsent_error = exc.message

    def _absorb(self) -> int:
        pending = self._pending
        popleft = pending.popleft
        flat: list[Any] = []
        for _ in range(len(pending)):  # the loop may append meanwhile
            flat += popleft()
        taken = len(flat) // FIELDS
        now = time.monotonic()
        budget = max(100, int(self.rows_per_s * (now - self._last_absorb)))
        self._last_absorb = now
        order: list[int] = list(range(taken))
        if self.rows_per_s and taken > budget:
            with_id = [i for i in order if flat[i * FIELDS + 2]]
            rest = [i for i in order if not flat[i * FIELDS + 2]]
            room = max(0, budget - len(with_id))
            if room < len(rest):
                self.sampled_out += len(rest) - room
                rest = random.sample(rest, room)
            order = with_id + rest
        # A slice at a time, each slice's arrays let go of before the next hand-over: freeing
        # a tick's ~500 requests' worth at once holds the GIL for ~2.5 ms in one piece, after
        # the last slice.
        for start in range(0, len(order), ABSORB_SLICE):
            yield_to_loop()  # on the tick's thread: the loop first
            chunk = order[start:start + ABSORB_SLICE]
            self._absorb_slice(flat, chunk)
            for i in chunk:  # the arrays go here, in this unit of work
                flat[i * FIELDS + 3] = flat[i * FIELDS + 4] = None
        self.records_seen += taken
        return taken

    def _absorb_slice(self, flat: list[Any], chunk: list[int]) -> None:
        """One slice of records (indices into ``flat``) into the windows, by version, in
        arrival order."""
        groups: dict[tuple[str, str], list[tuple[str, Any, Any]]] = {}
        for i in chunk:
            b = i * FIELDS
            groups.setdefault((flat[b], flat[b + 1]), []).append(
                (flat[b + 2], flat[b + 3], flat[b + 4]))
        for key, items in groups.items():
            self._absorb_version(key, items)

    def prepare(self, keys: list[tuple[str, str]]) -> None:
        """Make the monitors of these versions now (at load) and start their calibration."""
        with self._lock:
            for key in keys:
                self._monitors(key)

    def _monitors(self, key: tuple[str, str]) -> tuple[DriftMonitor | None, QualityMonitor | None]:
        if key not in self._meta:
            meta = self.lookup(*key)
            self._meta[key] = meta
            if meta is not None:
                s = self.settings
                drift = DriftMonitor.of_version(key[0], key[1], meta, s,
                                                self.folder(*key) if self.folder else None)
                drift.calibrate()  # thresholds on a background thread, not in a report
                self.drift[key] = drift
                self.quality[key] = QualityMonitor(
                    key[0], key[1], meta.task, meta.metrics or {}, s.quality_join_capacity,
                    s.quality_join_ttl_s, s.quality_window, s.quality_tolerance,
                    self.join.state(key[0], key[1], s.quality_join_capacity,
                                    s.quality_join_ttl_s, s.quality_window))
        return self.drift.get(key), self.quality.get(key)

    def _absorb_version(self, key: tuple[str, str], items: list[tuple[str, Any, Any]]) -> None:
        drift, quality = self._monitors(key)
        if drift is None or quality is None:
            return
        fast = _same_shape(items)
        if fast is not None:
            x_fast, s_fast, fast_ids = fast
            drift.add(x_fast, s_fast)
            quality.predicted(fast_ids, s_fast)
            if self.review.bucket.peek():
                self._review(key, drift, quality.classification, [(x_fast, s_fast, fast_ids)])
            return
        xs: list[np.ndarray] = []
        ss: list[np.ndarray] = []
        ids: list[str] = []
        paired: list[tuple[np.ndarray, np.ndarray, list[str]]] = []
        width = len(drift.names)
        for rid, inputs, outputs in items:
            x = input_matrix(inputs)
            s = scores(outputs)
            if x is not None and s is not None and x.shape[0] == 1 and x.shape[1] == s.size > 1:
                x = x.reshape(-1, 1)  # a batched 1-D input ([None]): one value per row
            if x is not None and x.shape[1] != width:
                x = None  # not the profile's columns: nothing to compare it with
            row_ids = None
            if s is not None:
                ss.append(s)
                row_ids = [rid] if s.size == 1 else [f"{rid}:{i}" if rid else ""
                                                     for i in range(s.size)]
                ids.extend(row_ids)
            if x is not None:
                xs.append(x)
                if row_ids is not None and x.shape[0] == s.size:  # type: ignore[union-attr]
                    paired.append((x, s, row_ids))  # type: ignore[arg-type]
        x_all = np.concatenate(xs) if xs else None
        s_all = np.concatenate(ss) if ss else None
        drift.add(x_all, s_all)
        if s_all is not None:
            quality.predicted(ids, s_all)
        if paired and self.review.bucket.peek():
            self._review(key, drift, quality.classification, paired)

    def _review(self, key: tuple[str, str], drift: DriftMonitor, classification: bool,
                paired: list[tuple[np.ndarray, np.ndarray, list[str]]]) -> None:
        """Offer edge cases to the review queue: found with whole-array tests, and only while
        the queue's rate allows (it bounds this work too)."""
        x = np.concatenate([p[0] for p in paired]).astype(np.float64, copy=False)
        s = np.concatenate([p[1] for p in paired])
        row_ids = [rid for p in paired for rid in p[2]]
        if x.shape[1] != len(drift.names):
            return
        lo, hi = drift.bounds()
        with np.errstate(invalid="ignore"):
            outside = (x < lo) | (x > hi)
        uncertain = (np.abs(s - 0.5) < self.settings.review_margin) if classification else \
            np.zeros(s.size, dtype=bool)
        drifted = sorted(drift.last_report["drifted"]) if drift.last_report else []
        candidates = (np.flatnonzero(outside.any(axis=1) | uncertain) if not drifted
                      else np.arange(s.size))
        for i in candidates:
            reasons = []
            if uncertain[i]:
                reasons.append("uncertain")
            bad = [drift.names[j] for j in np.flatnonzero(outside[i])]
            if bad:
                reasons.append("out_of_range:" + ",".join(bad))
            if drifted:
                reasons.append("drift:" + ",".join(drifted))
            features = {name: _py(x[i, j]) for j, name in enumerate(drift.names)}
            score = float(s[i])
            if not self.review.offer(key[0], key[1], row_ids[i], reasons, features, score,
                                     score):
                return  # the rate is spent: the rest waits for the next tick

    # ------------------------------------------------------------------ labels
    def label(self, model: str | None, request_id: str, label: float) -> bool:
        """Join a label to the prediction it belongs to (any version of ``model``)."""
        return self.label_many(model, [request_id], [label]).joined == 1

    def label_many(self, model: str | None, request_ids: list[str], labels: list[float]
                   ) -> JoinOutcome:
        """Join labels to their predictions (any version of ``model``, or of any model).
        Raises ``StoreUnavailable`` when a shared join is down."""
        states = [q.state for key, q in sorted(self.quality.items())
                  if model is None or key[0] == model]
        return join_labels(states, request_ids, labels)

    def versions(self, model: str) -> list[tuple[str, str]]:
        return sorted((k for k in self.drift if k[0] == model), key=lambda k: _vkey(k[1]))


def _same_shape(items: list[tuple[str, Any, Any]]
                ) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """The common case at once: every request has one input tensor and a binary classifier's
    ``probabilities`` (or one output), so the arrays concatenate and convert in one go. None
    when the requests are not alike (the general path then takes them one by one)."""
    inputs, outputs = items[0][1], items[0][2]
    if not (isinstance(inputs, dict) and len(inputs) == 1 and isinstance(outputs, dict)):
        return None
    in_key = next(iter(inputs))
    out_key = "probabilities" if "probabilities" in outputs else (
        next(iter(outputs)) if len(outputs) == 1 else None)
    if out_key is None:
        return None
    try:
        x = np.concatenate([it[1][in_key] for it in items])
        y = np.concatenate([it[2][out_key] for it in items])
    except (KeyError, TypeError, ValueError):
        return None
    if x.ndim != 2 or x.dtype.kind not in "fiu" or y.dtype.kind not in "fiu":
        return None
    score = scores({out_key: y} if out_key == "probabilities" else y)
    if score is None or score.size != x.shape[0]:
        return None
    if score.size == len(items):
        ids = [it[0] for it in items]
    else:
        ids = []
        for rid, _, out in items:
            n = int(out[out_key].shape[0])
            ids.extend([rid] if n == 1 else [f"{rid}:{i}" if rid else "" for i in range(n)])
    return x, score, ids


def input_matrix(inputs: Any) -> np.ndarray | None:
    """The 2-D numeric input of a request (V2 dict of tensors, or /v1's assembled rows)."""
    if inputs is None:
        return None
    if isinstance(inputs, dict):
        arrays = [v for v in inputs.values() if isinstance(v, np.ndarray)]
        if len(arrays) != 1:
            return None
        inputs = arrays[0]
    x = np.asarray(inputs)
    if x.dtype.kind not in "fiub":
        return None
    if x.ndim == 1:
        x = x.reshape(1, -1)
    return x if x.ndim == 2 else None


def scores(outputs: Any) -> np.ndarray | None:
    """One number per row: P(class 1) for a binary classifier, the top probability for several
    classes, the value itself for a regressor."""
    if outputs is None:
        return None
    if isinstance(outputs, dict):
        if "probabilities" in outputs:
            p = np.asarray(outputs["probabilities"], dtype=np.float64)
            if p.ndim == 2:
                return p[:, 1] if p.shape[1] == 2 else p.max(axis=1)
            return p.reshape(-1)
        arrays = [v for v in outputs.values() if isinstance(v, np.ndarray)
                  and v.dtype.kind in "fiu"]
        if not arrays:
            return None
        outputs = arrays[-1]
    y = np.asarray(outputs)
    if y.dtype.kind not in "fiub":
        return None
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 2 and y.shape[1] == 2:
        y = y[:, 1]
    return y.astype(np.float64).reshape(-1) if y.ndim <= 1 else None


def _py(v: Any) -> Any:
    f = float(v)
    return int(f) if f.is_integer() else f


def _vkey(v: str) -> tuple[int, str]:
    return (int(v), v) if v.isdigit() else (1 << 30, v)
