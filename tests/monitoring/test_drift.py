"""Drift: no alarm on unchanged data of any size, alarms on real shifts, per feature."""

from __future__ import annotations

import numpy as np
import pytest

from redline.models.metadata import profile_inputs
from redline.monitoring.drift import DriftMonitor

NAMES = ["amount", "age", "channel"]


def data(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.column_stack([rng.lognormal(3, 1, n), rng.normal(40, 12, n),
                            rng.choice(4, n, p=[0.5, 0.3, 0.15, 0.05])])


@pytest.fixture(scope="module")
def profile() -> dict:
    return profile_inputs(data(np.random.default_rng(0), 20_000), NAMES)


def report(profile: dict, live: np.ndarray, window: int = 50_000) -> dict:
    monitor = DriftMonitor("m", "1", profile, NAMES, window_rows=window, min_rows=100)
    monitor.add(live, None)
    return monitor.report()


def test_profile_marks_low_cardinality_integers_categorical(profile: dict) -> None:
    assert "categories" in profile["features"]["channel"]
    assert "categories" not in profile["features"]["age"]


@pytest.mark.slow
@pytest.mark.parametrize("n", [300, 3_000, 50_000])
def test_unchanged_data_does_not_alarm_at_any_size(profile: dict, n: int) -> None:
    rng = np.random.default_rng(n)
    alarms = sum(report(profile, data(rng, n))["drift"] for _ in range(5))
    assert alarms == 0


def test_shifts_alarm_on_the_shifted_feature_only(profile: dict) -> None:
    rng = np.random.default_rng(7)
    live = data(rng, 3000)
    live[:, 1] += 12 * 0.5  # half a standard deviation older
    r = report(profile, live)
    assert r["drifted"] == ["age"]
    age = next(f for f in r["features"] if f["feature"] == "age")
    assert age["statistics"]["wasserstein"] > age["thresholds"]["wasserstein"]


def test_categorical_shares_and_unseen_categories(profile: dict) -> None:
    rng = np.random.default_rng(8)
    live = data(rng, 3000)
    live[:1000, 2] = 3  # the rare channel becomes common
    live[1000:1300, 2] = 9  # and one never seen in training appears
    r = report(profile, live)
    channel = next(f for f in r["features"] if f["feature"] == "channel")
    assert channel["drift"] and channel["kind"] == "categorical"
    assert channel["shares"]["unseen"] == pytest.approx(0.1, abs=0.01)
    assert channel["reference_shares"]["3"] == pytest.approx(0.05, abs=0.01)
    assert channel["out_of_range_rate"] == pytest.approx(0.1, abs=0.01)


def test_missing_and_out_of_range_rates(profile: dict) -> None:
    rng = np.random.default_rng(9)
    live = data(rng, 2000)
    live[:400, 0] = np.nan
    live[400:600, 1] = 500.0
    r = report(profile, live)
    amount = next(f for f in r["features"] if f["feature"] == "amount")
    age = next(f for f in r["features"] if f["feature"] == "age")
    assert amount["missing_rate"] == pytest.approx(0.2) and "missing_rate" in amount["beyond"]
    assert age["out_of_range_rate"] == pytest.approx(0.1) and "out_of_range_rate" in age["beyond"]


def test_each_feature_reads_as_if_reported_alone(profile: dict) -> None:
    """The report sorts every feature's window at once (few numpy calls, see ``report``):
    non-finite values of one feature must not shift another's, and each feature's rates and
    statistics are those of its own finite values, computed straight from its reference."""
    rng = np.random.default_rng(12)
    live = data(rng, 3000)
    live[rng.random(3000) < 0.15, 0] = np.nan
    live[rng.random(3000) < 0.05, 1] = np.inf
    live[rng.random(3000) < 0.05, 1] = -np.inf
    live[rng.random(3000) < 0.1, 1] = 1e6  # out of range, finite
    live[rng.random(3000) < 0.2, 2] = np.nan
    monitor = DriftMonitor("m", "1", profile, NAMES, window_rows=5000, min_rows=100)
    monitor.add(live, None)
    r = monitor.report()
    for i, f in enumerate(r["features"]):
        ref = monitor.references[i]
        finite = live[:, i][np.isfinite(live[:, i])]
        outside = np.count_nonzero((finite < ref.lo) | (finite > ref.hi)) / finite.size
        assert f["rows"] == 3000
        assert f["missing_rate"] == round(1 - finite.size / 3000, 4)
        assert f["out_of_range_rate"] == round(outside, 4)
        alone = {k: round(v, 5) for k, v in ref.statistics(finite).items()}
        assert f["statistics"] == alone, f["feature"]
    assert r["features"][1]["out_of_range_rate"] > 0.05  # the check above saw real outliers


def test_window_is_bounded_and_small_windows_never_alarm(profile: dict) -> None:
    monitor = DriftMonitor("m", "1", profile, NAMES, window_rows=1000, min_rows=200)
    rng = np.random.default_rng(10)
    tiny = data(rng, 50) + 1000
    monitor.add(tiny, None)
    assert not monitor.report()["drift"]  # 50 rows < min_rows: reported, not judged
    for _ in range(5):
        monitor.add(data(rng, 700), None)
    r = monitor.report()
    assert r["window"]["rows"] == 1000 and r["window"]["seen"] == 3550
    assert not r["drift"]  # the shifted rows have left the window


def test_prediction_drift_against_the_first_live_window(profile: dict) -> None:
    monitor = DriftMonitor("m", "1", profile, NAMES, window_rows=2000, min_rows=100)
    rng = np.random.default_rng(11)
    monitor.add(None, rng.beta(2, 5, 1000))  # the baseline
    monitor.add(None, rng.beta(2, 5, 2000))
    assert not monitor.report()["prediction"]["drift"]
    monitor.add(None, rng.beta(5, 2, 2000))
    r = monitor.report()
    assert r["prediction"]["drift"]
    # the verdict names what drifted, the model's own output included
    assert r["drift"] and r["drifted"] == ["prediction"]


@pytest.mark.slow
def test_redline_drift_headline_names_a_drifting_prediction(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``redline drift``'s headline and ``drifted`` list name the prediction its table shows."""
    import json
    import time

    import httpx

    from redline.cli import main
    from tests.monitoring.served import start, training_data, v2_body

    server = start(tmp_path / "repo")
    try:
        rng = np.random.default_rng(5)
        with httpx.Client(base_url=server.http, timeout=30,
                          headers={"x-redline-budget-ms": "5000"}) as http:
            # every request with an id enters the windows (no sampling by rate)
            for i in range(10):  # the first 1,000 predictions: the prediction's baseline
                assert http.post("/v2/models/fraud/infer", json=v2_body(
                    training_data(rng, 100), f"base{i}")).status_code == 200
            deadline = time.monotonic() + 30
            while http.get("/v1/models/fraud/drift").json()["versions"][0]["prediction"] is None:
                assert time.monotonic() < deadline, "the prediction's baseline was not taken"
                time.sleep(0.1)
            for i in range(10):  # larger amounts: higher scores
                x = training_data(rng, 100)
                x[:, 0] += 4
                assert http.post("/v2/models/fraud/infer",
                                 json=v2_body(x, f"shifted{i}")).status_code == 200
        out = tmp_path / "drift.json"
        try:
            main(["drift", "-m", "fraud", "--url", server.http, "--json-out", str(out)])
        except SystemExit as exc:
            assert exc.code in (0, None)
        report = json.loads(out.read_text())["versions"][0]
        assert report["prediction"]["drift"] and report["drift"]
        assert report["drifted"][-1] == "prediction" and "amount" in report["drifted"]
        headline = " ".join(capsys.readouterr().out.split("(window")[0].split())
        assert headline.endswith("DRIFT: " + ", ".join(report["drifted"])), headline
    finally:
        server.stop()


def test_a_window_without_new_rows_is_not_reported_again(profile: dict) -> None:
    """The tick reports a version only when rows or predictions came in since its last report
    (the same rows give the same report)."""
    monitor = DriftMonitor("m", "1", profile, NAMES, window_rows=5000, min_rows=100)
    assert monitor.changed()  # never reported
    rng = np.random.default_rng(3)
    monitor.add(data(rng, 500), rng.random(500))
    first = monitor.report()
    assert not monitor.changed()
    monitor.add(None, rng.random(1))  # one prediction is a change too
    assert monitor.changed()
    monitor.report()
    monitor.add(data(rng, 1), None)
    assert monitor.changed()
    again = monitor.report()
    assert not monitor.changed()
    assert again["window"]["rows"] == first["window"]["rows"] + 1
