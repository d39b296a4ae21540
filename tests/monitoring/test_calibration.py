"""Drift thresholds are calibrated once per version, on a background thread once the ports are
open, and kept beside the version: the first report does not pay for it, requests served
meanwhile are not held up, and a restarted server reads them instead of calibrating."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from redline.models import ModelRepository
from redline.models.metadata import profile_inputs
from redline.monitoring.drift import DriftMonitor, FeatureReference, size_classes
from redline.monitoring.routes import calibrating_report
from redline.monitoring.threshold_file import FILE_NAME
from tests.monitoring.served import monitored_settings, start, training_data, v2_body
from tests.serving.helpers import ServerThread

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def _calibrated(server: Any, key: tuple[str, str]) -> DriftMonitor:
    drift: DriftMonitor = server.server.monitor.windows.drift[key]
    assert drift.wait_calibrated(60)
    return drift


def test_thresholds_are_calibrated_once_per_version_and_kept_beside_it(tmp_path: Path) -> None:
    """The first server calibrates in the background once its ports are open and keeps the
    result in the version's folder; a restarted server reads it instead of calibrating."""
    server = start(tmp_path)
    try:
        drift = _calibrated(server, ("fraud", "1"))  # made at load, no request sent
        assert drift.thresholds_from == "computed"
        refs = list(drift.references.values())
        assert refs and all(len(r._thresholds) >= 5 for r in refs)  # every window size
        first = {r.name: r.calibration() for r in refs}
    finally:
        server.stop()
    kept = tmp_path / "fraud" / "1" / FILE_NAME
    assert kept.is_file()
    again = ServerThread(monitored_settings(), ModelRepository(tmp_path)).start()
    try:
        drift = _calibrated(again, ("fraud", "1"))
        assert drift.thresholds_from == "file"
        assert {r.name: r.calibration() for r in drift.references.values()} == first
    finally:
        again.stop()


def test_kept_thresholds_of_another_profile_are_calibrated_again(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    names = ["a", "b"]
    profile = profile_inputs(rng.normal(size=(2000, 2)), names)
    other_profile = profile_inputs(rng.normal(3, 2, size=(2000, 2)), names)

    def calibrated(prof: dict[str, Any]) -> str | None:
        drift = DriftMonitor("m", "1", prof, names, 1000, 100, keep_in=tmp_path)
        drift.calibrate(background=False)
        return drift.thresholds_from

    assert calibrated(profile) == "computed" and (tmp_path / FILE_NAME).is_file()
    assert calibrated(profile) == "file"
    assert calibrated(other_profile) == "computed"  # the file was for another profile
    (tmp_path / FILE_NAME).write_text("{not json")
    assert calibrated(profile) == "computed"  # an unreadable file is calibrated again
    assert calibrated(profile) == "file"


def test_drift_reads_calibrating_until_the_thresholds_exist() -> None:
    rng = np.random.default_rng(2)
    names = [f"f{i}" for i in range(3)]
    drift = DriftMonitor("m", "1", profile_inputs(rng.normal(size=(2000, 3)), names), names,
                         1000, 100)
    report = calibrating_report(drift)
    assert report["calibrating"] is True and report["drift"] is False
    assert report["features"] == [] and "calibrating" in report["note"]
    drift.calibrate(background=False)
    assert "calibrating" not in drift.report()


def test_requests_during_a_calibration_are_not_delayed(tmp_path: Path) -> None:
    """A wide version (20 features, two seconds of calibration CPU on this machine, far more
    than the bound below) calibrates on its background thread while one client sends requests
    to the same process's server: the requests answered meanwhile take about as long as those
    after it. (40 features took five seconds alone and twice that under the requests: the
    thousands of requests it let through proved nothing more than the 20 features' do.)"""
    settings = monitored_settings()
    server = start(tmp_path, settings)
    rng = np.random.default_rng(0)
    wide = rng.normal(size=(5000, 20))
    names = [f"f{i}" for i in range(20)]
    x = training_data(rng, 1)
    body = v2_body(x)

    def timed(http: httpx.Client) -> float:
        t = time.perf_counter()
        assert http.post("/v2/models/fraud/infer", json=body).status_code == 200
        return time.perf_counter() - t

    def one_calibration(http: httpx.Client) -> tuple[float, float, float]:
        """(median during, median after, slowest during) for one background calibration."""
        drift = DriftMonitor("wide", "1", profile_inputs(wide, names), names, 5000, 200)
        during: list[float] = []
        drift.calibrate()  # background
        assert isinstance(drift._calibration, threading.Thread)
        while not drift.calibrated:
            during.append(timed(http))
        # as many as during (a median as steady), up to 1,000: a median of 1,000 is steady
        after = [timed(http) for _ in range(min(max(200, len(during)), 1000))]
        assert len(during) >= 20, f"calibration too short to measure ({len(during)} requests)"
        return statistics.median(during), statistics.median(after), max(during)

    # Not delayed beyond noise: a calibration on the event loop would hold requests for the
    # whole calibration (seconds); here the median stays within a small factor and no
    # request waits a quarter of a second. A shared CPU can stall the whole process once, so
    # the bounds must hold in one of three calibrations (a real hold fails every one).
    tries = []
    try:
        with httpx.Client(base_url=server.http, timeout=30) as http:
            for _ in range(200):
                timed(http)  # warm
            for _ in range(3):
                med_during, med_after, slowest = one_calibration(http)
                tries.append((med_during, med_after, slowest))
                if med_during <= 3 * med_after + 0.002 and slowest < 0.25:
                    break
    finally:
        server.stop()
    med_during, med_after, slowest = tries[-1]
    assert med_during <= 3 * med_after + 0.002 and slowest < 0.25, tries


def test_the_calibration_covers_every_window_size_a_report_meets() -> None:
    """Every size class a filling window passes through is computed by the calibration, so no
    report computes thresholds (it once left out a third of the classes: ~4 ms a feature in
    the first report at each, on the monitoring tick)."""
    sample = training_data(np.random.default_rng(0), 5000).astype(np.float64)
    names = ["amount", "age", "channel"]
    monitor = DriftMonitor("m", "1", profile_inputs(sample, names), names, window_rows=5000)
    monitor.calibrate(background=False)
    cached = {name: set(ref._thresholds) for name, ref in
              ((r.name, r) for r in monitor.references.values())}
    for ref in monitor.references.values():
        for n in range(100, 5001, 7):
            ref.thresholds(n)
        assert set(ref._thresholds) == cached[ref.name], ref.name


def test_the_prediction_baseline_is_calibrated_once_at_its_first_report() -> None:
    """The live baseline of predictions has no profile to calibrate at load: its first judged
    report computes every window size class (in hand-over-sized chunks), so no later report
    computes thresholds as the window fills; the numbers are those of the lazy way."""
    rng = np.random.default_rng(4)
    monitor = DriftMonitor("m", "1", {}, ["x"], window_rows=5000, min_rows=200)
    monitor.add(None, rng.beta(2, 5, 1000))  # the baseline
    monitor.add(None, rng.beta(2, 5, 300))
    first = monitor.report()["prediction"]["thresholds"]
    ref = monitor.prediction_ref
    assert ref is not None and set(ref._thresholds) == set(size_classes(5000))
    computed = []
    original = FeatureReference.class_thresholds

    def counting(self: FeatureReference, size: int) -> dict[str, float]:
        if size not in self._thresholds:
            computed.append(size)
        return original(self, size)

    FeatureReference.class_thresholds = counting  # type: ignore[method-assign]
    try:
        for _ in range(10):
            monitor.add(None, rng.beta(2, 5, 450))
            monitor.report()
    finally:
        FeatureReference.class_thresholds = original  # type: ignore[method-assign]
    assert computed == []
    # the first report's thresholds are those a monitor computing only that class gives
    fresh = DriftMonitor("m", "1", {}, ["x"], window_rows=5000, min_rows=200)
    fresh.add(None, np.random.default_rng(4).beta(2, 5, 1000))
    fresh_ref = fresh.prediction_ref
    assert fresh_ref is not None
    assert first == {k: round(v, 5) for k, v in fresh_ref.thresholds(300).items()}


def test_the_ports_open_while_a_calibration_still_runs(tmp_path: Path, monkeypatch) -> None:
    """Nothing waits for the drift thresholds before the ports open: with the calibration held
    back, the server is ready and answers, and drift reads "calibrating" until it is done."""
    import redline.monitoring.drift.monitor as drift_module
    import redline.monitoring.routes as routes

    release = threading.Event()
    calibrate_all = drift_module.calibrate_all

    def held(refs: list[FeatureReference], capacity: int,
             stop: threading.Event | None = None) -> None:
        release.wait(60)
        calibrate_all(refs, capacity, stop)

    monkeypatch.setattr(drift_module, "calibrate_all", held)
    monkeypatch.setattr(routes, "CALIBRATION_WAIT_S", 0.0)
    server = start(tmp_path)
    try:
        body = v2_body(training_data(np.random.default_rng(3), 1))
        with httpx.Client(base_url=server.http, timeout=30) as http:
            assert http.get("/v2/health/ready").status_code == 200
            assert http.post("/v2/models/fraud/infer", json=body).status_code == 200
            [report] = http.get("/v1/models/fraud/drift").json()["versions"]
            assert report["calibrating"] is True and report["drift"] is False
            release.set()
            drift = _calibrated(server, ("fraud", "1"))
            assert drift.thresholds_from == "computed"
            [report] = http.get("/v1/models/fraud/drift").json()["versions"]
            assert "calibrating" not in report and report["features"]
    finally:
        release.set()
        server.stop()


def test_a_stopped_server_ends_its_calibration_and_keeps_nothing(tmp_path: Path) -> None:
    """A calibration still running when its server stops ends between two chunks (a daemon
    thread cut inside numpy at exit aborts the process) and leaves no file behind."""
    rng = np.random.default_rng(4)
    names = [f"f{i}" for i in range(40)]
    drift = DriftMonitor("wide", "1", profile_inputs(rng.normal(size=(5000, 40)), names), names,
                         5000, 200, keep_in=tmp_path)
    drift.calibrate()  # background
    thread = drift._calibration
    assert isinstance(thread, threading.Thread)
    drift.stop_calibration()
    assert not thread.is_alive()
    assert not drift.calibrated and not drift.wait_calibrated(0.5)
    assert not (tmp_path / FILE_NAME).exists()
