"""The drift monitor of one model version: its live window against its reference profile.

Rows and predictions are added as requests are answered (``add``, cheap, under a lock); a report
(``report``, on the monitoring tick or a drift request) compares each feature's window with its
reference and says which drifted. Thresholds are calibrated once per version, in the background
after the ports open, or read back from beside the version (``calibrate``).
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from redline.monitoring.drift.calibration import (
    CALIBRATION_CONSTANTS,
    EXITING,
    RUNNING,
    CalibrationStopped,
    calibrate_all,
    rate_threshold,
)
from redline.monitoring.drift.reference import FeatureReference
from redline.monitoring.drift.window import RollingWindow
from redline.monitoring.handoff import yield_to_loop
from redline.monitoring.threshold_file import ThresholdFile, fingerprint


class DriftMonitor:
    """Live inputs (and predictions) of one model version against its reference profile."""

    def __init__(self, model: str, version: str, profile: dict[str, Any],
                 feature_names: list[str] | None, window_rows: int = 5000,
                 min_rows: int = 200, keep_in: Path | None = None) -> None:
        """``keep_in``: the version's folder, where calibrated thresholds are kept and found."""
        self.model, self.version = model, version
        self.min_rows = min_rows
        levels = profile.get("quantile_levels", [])
        feats = profile.get("features", {})
        names = feature_names or list(feats)
        self.names = names
        self.references: dict[int, FeatureReference] = {}
        for i, name in enumerate(names):
            prof = feats.get(name)
            if prof and "histogram" in prof:
                self.references[i] = FeatureReference.from_profile(name, prof, levels,
                                                                   int(profile.get("rows", 0)))
        self.window = RollingWindow(len(names), window_rows)
        self.predictions = RollingWindow(1, window_rows)
        self.prediction_ref: FeatureReference | None = None
        self._baseline: list[np.ndarray] = []
        self._baseline_rows = 0
        self._baseline_target = window_rows
        self.skipped = 0  # rows whose width did not match the profile
        self._lock = threading.Lock()
        self._calibrated = threading.Event()
        self._calibration: threading.Thread | None = None
        self._stop = threading.Event()  # stop_calibration: end the background calibration
        self._prediction_calibrated = False  # every size class of the baseline's thresholds
        self.calibration_s: float | None = None  # how long the calibration took (CPU time)
        self.thresholds_from: str | None = None  # "file" (kept beside the version) | "computed"
        self._file = None if keep_in is None else ThresholdFile(
            keep_in, fingerprint(profile, names, window_rows, CALIBRATION_CONSTANTS))
        self.last_report: dict[str, Any] | None = None
        self._reported: tuple[int, int, bool] | None = None  # the rows the last report read
        self._bounds: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def of_version(cls, model: str, version: str, meta: Any, settings: Any,
                   keep_in: Path | None) -> DriftMonitor:
        """The monitor a server makes for a loaded version: its metadata's profile and
        features, ``settings``' (``MonitoringSettings``) window, thresholds kept in ``keep_in``."""
        return cls(model, version, meta.input_profile or {}, meta.feature_names,
                   settings.drift_window_rows, settings.drift_min_rows, keep_in=keep_in)

    @property
    def has_reference(self) -> bool:
        return bool(self.references)

    # ------------------------------------------------------------------ calibration
    def calibrate(self, background: bool = True) -> None:
        """Work out every feature's thresholds for every window size now, so no report pays
        for it (left to the first report, it costs ~0.6 s of CPU for three features, on the
        thread that asked). In the background (a daemon thread, in small chunks that give the
        GIL back), or here and now with ``background=False``. Idempotent."""
        with self._lock:
            if self._calibration is not None or self._calibrated.is_set():
                return
            if not background:
                self._calibration = threading.current_thread()
        if not background:
            self._calibrate()
            return
        thread = threading.Thread(target=self._calibrate, daemon=True,
                                  name=f"redline-drift-calibration-{self.model}-{self.version}")
        self._calibration = thread
        RUNNING.add(thread)
        thread.start()

    def stop_calibration(self, timeout_s: float = 5.0) -> None:
        """End a background calibration between two chunks (its server stops): nothing is
        kept, the next server of this version calibrates again."""
        self._stop.set()
        thread = self._calibration
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _calibrate(self) -> None:
        t0 = time.thread_time()
        try:
            if self._restore():
                self.thresholds_from = "file"
                return
            calibrate_all(list(self.references.values()), self.window.capacity, self._stop)
            self.thresholds_from = "computed"
            if self._file is not None and self.references:
                self._file.save({ref.name: ref.calibration()
                                 for ref in self.references.values()})
        except CalibrationStopped:
            return  # left unfinished on purpose: never calibrated, never kept
        finally:
            self.calibration_s = time.thread_time() - t0
            if self.thresholds_from is not None:
                self._calibrated.set()
            RUNNING.discard(threading.current_thread())

    def _restore(self) -> bool:
        """The thresholds kept beside the version, when they were computed for this profile."""
        if self._file is None or not self.references:
            return False
        kept = self._file.load()
        if kept is None or any(ref.name not in kept for ref in self.references.values()):
            return False
        try:
            for ref in self.references.values():
                ref.restore(kept[ref.name])
        except (TypeError, ValueError, AttributeError):
            return False
        return True

    @property
    def calibrated(self) -> bool:
        return self._calibrated.is_set()

    def wait_calibrated(self, timeout_s: float | None = None) -> bool:
        """Block until the calibration is done (starting it here if nobody did)."""
        if not self._calibrated.is_set() and self._calibration is None:
            self.calibrate(background=False)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._calibrated.wait(
                0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))):
            if self._stop.is_set() or EXITING.is_set():
                return False  # stopped: it will never be done
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def add(self, inputs: np.ndarray | None, scores: np.ndarray | None) -> None:
        with self._lock:
            if inputs is not None:
                if inputs.ndim == 2 and inputs.shape[1] == len(self.names):
                    self.window.add(inputs.astype(np.float64, copy=False))
                else:
                    self.skipped += int(inputs.shape[0]) if inputs.ndim else 1
            if scores is not None and scores.size:
                col = scores.reshape(-1, 1).astype(np.float64, copy=False)
                self.predictions.add(col)
                if self.prediction_ref is None:
                    self._baseline.append(col[:, 0])
                    self._baseline_rows += col.shape[0]
                    if self._baseline_rows >= min(self._baseline_target, 1000):
                        self._freeze_prediction_baseline()

    def _freeze_prediction_baseline(self) -> None:
        """No training profile of predictions exists: the first live ones are the baseline."""
        from redline.models.metadata import profile_inputs

        base = np.concatenate(self._baseline)
        prof = profile_inputs(base.reshape(-1, 1), ["prediction"])
        feat = prof.get("features", {}).get("prediction")
        if feat and "histogram" in feat:
            self.prediction_ref = FeatureReference.from_profile(
                "prediction", feat, prof["quantile_levels"], int(prof.get("rows", 0)))
        self._baseline = []
        self.predictions = RollingWindow(1, self.predictions.capacity)

    def _rows_seen(self) -> tuple[int, int, bool]:
        """What the windows have taken in so far (under the lock)."""
        return self.window.seen, self.predictions.seen, self.prediction_ref is not None

    def changed(self) -> bool:
        """Whether rows or predictions came in since the last report. The same rows give the
        same report, so the tick reports a version only when this is true (its last report and
        gauges stand meanwhile): a model without traffic costs no report."""
        with self._lock:
            return self._reported is None or self._rows_seen() != self._reported

    def report(self) -> dict[str, Any]:
        """Per feature (and the prediction): statistics, thresholds, rates and the verdict.

        Waits for the calibration (call it from a worker thread, never the event loop)."""
        self.wait_calibrated()
        with self._lock:
            rows = self.window.rows().copy()
            preds = self.predictions.rows()[:, 0].copy()
            started, seen = self.window.started, self.window.seen
            reported = self._rows_seen()
        # Every feature's values at once, each feature's finite ones first and sorted: a few
        # calls over the whole window instead of a dozen per feature. numpy lets the GIL go in
        # each call over thousands of values, and at capacity the loop takes it every time, so
        # the number of such calls, not their work, is what a report costs the requests.
        columns = np.ascontiguousarray(rows.T)
        present = np.isfinite(columns)
        finite_counts = present.sum(axis=1)
        ordered = np.sort(np.where(present, columns, np.nan), axis=1)  # NaN sorts last
        n_all = columns.shape[1]
        features = []
        for i, ref in sorted(self.references.items()):
            yield_to_loop()  # on the tick's thread: the loop first
            features.append(self._one(ref, ordered[i, :finite_counts[i]], n_all))
        prediction = None
        if self.prediction_ref is not None:
            yield_to_loop()
            finite = np.sort(preds[np.isfinite(preds)])
            prediction = self._one(self.prediction_ref, finite, preds.size,
                                   reference="first live window")
            if not self._prediction_calibrated and prediction["thresholds"]:
                # The baseline's thresholds for every other window size too, now, once (after
                # the class this report needed, so its numbers are those it always had):
                # computed as the window fills, each new size class would be ~1 ms of
                # thresholds in one piece in a later report on the tick. Here in hand-over-sized
                # chunks.
                calibrate_all([self.prediction_ref], self.predictions.capacity)
                self._prediction_calibrated = True
        drifted = [f["feature"] for f in features if f["drift"]]
        if prediction is not None and prediction["drift"]:
            drifted.append(prediction["feature"])  # "prediction": the model's own output
        report = {
            "model": self.model, "version": self.version,
            "window": {"rows": int(rows.shape[0]), "capacity": self.window.capacity,
                       "seen": int(seen), "since": round(started, 3),
                       "min_rows": self.min_rows, "skipped_rows": self.skipped},
            "reference": "training profile" if self.references else None,
            "features": features, "prediction": prediction,
            "drifted": drifted, "drift": bool(drifted),
        }
        self.last_report = report
        self._reported = reported
        return report

    def _one(self, ref: FeatureReference, ordered: np.ndarray, n_all: int,
             reference: str = "training profile") -> dict[str, Any]:
        """One feature's report from its finite values ``ordered`` (sorted ascending) of a
        window of ``n_all`` rows."""
        n = ordered.size
        out: dict[str, Any] = {"feature": ref.name, "kind": ref.kind, "rows": int(n_all)}
        missing = 1.0 - n / n_all if n_all else 0.0  # the rows without a value
        out["missing_rate"] = round(missing, 4)
        out["reference_missing_rate"] = round(ref.missing_share, 4)
        # of the rows with a value: those below lo and those above hi, read off the order
        below = int(np.searchsorted(ordered, ref.lo, side="left"))
        above = n - int(np.searchsorted(ordered, ref.hi, side="right"))
        out_of_range = (below + above) / n if n else 0.0
        out["out_of_range_rate"] = round(out_of_range, 4)
        if n < self.min_rows:
            out.update(statistics={}, thresholds={}, drift=False,
                       reason=f"window has {n} rows, fewer than min_rows {self.min_rows}")
            return out
        stats = ref.statistics(ordered, presorted=True)
        limits = ref.thresholds(n)
        beyond = [k for k, v in stats.items() if v > limits[k]]
        if missing > rate_threshold(ref.missing_share, n_all):
            beyond.append("missing_rate")
        if out_of_range > rate_threshold(0.0, n):
            beyond.append("out_of_range_rate")
        out["statistics"] = {k: round(v, 5) for k, v in stats.items()}
        out["thresholds"] = {k: round(v, 5) for k, v in limits.items()}
        if ref.kind == "categorical":
            live = ref.shares(ordered)
            keys = [_fmt(c) for c in ref.categories] + ["unseen"]
            out["shares"] = {k: round(float(v), 4) for k, v in zip(keys, live, strict=True)}
            out["reference_shares"] = {k: round(float(v), 4)
                                       for k, v in zip(keys, ref.ref_p, strict=True)}
        out["drift"] = bool(beyond)
        out["beyond"] = beyond
        if reference != "training profile":
            out["reference"] = reference
        return out

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The training min and max per input column (infinite where not profiled)."""
        if self._bounds is None:
            lo = np.full(len(self.names), -np.inf)
            hi = np.full(len(self.names), np.inf)
            for i, ref in self.references.items():
                lo[i], hi[i] = ref.lo, ref.hi
            self._bounds = (lo, hi)
        return self._bounds

    def out_of_range(self, row: np.ndarray) -> list[str]:
        """Names of the features of one row outside the training range (for review)."""
        bad = []
        for i, ref in self.references.items():
            v = row[i]
            if math.isfinite(v) and (v < ref.lo or v > ref.hi):
                bad.append(ref.name)
        return bad


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
