"""A whole zone lost under load: zone A's serving replica, its Redis primary, a sentinel and its
ingest consumer SIGKILLed at once (``zonedrill.py``). Through ``redline.Client`` nothing fails;
answers degrade, with the reason, until zone B's Redis replica is promoted; every event lands in
the store once; zone A comes back as it was. ``benchmarks/scaling/zone_loss.py`` runs the same
drill longer and prints the figures in docs/scaling.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scaling import zonedrill

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


@pytest.mark.timeout(240)
def test_zone_loss_fails_nothing_through_the_client_and_loses_no_event(tmp_path: Path) -> None:
    why = zonedrill.missing()
    if why is not None:
        pytest.skip(why)
    report = zonedrill.run_drill(tmp_path, zonedrill.Timings(steady=2.0, lost=3.0, back=1.5))
    client, proxy = report["client"], report["haproxy"]
    assert client["failed"] == 0, report
    assert (report["events_lost"], report["events_doubled"]) == (0, 0), report
    # the loss was seen, and said why: the store's primary died with the zone
    assert client["degraded_during"] > 0 and all(
        "feature store" in why for why in client["degraded_reasons"]), report
    assert report["zone_b_undegraded_s"] < 20, report
    # zone A back (its Redis as zone B's replica, its replica serving again): nothing fails
    assert report["zone_a_back_to_ready_s"] > 0 and client["p99_ms_zone_a_back"] is not None
    # HAProxy sends a request again when its replica died before answering; the one it closed
    # unanswered on a kept-alive connection is sent again once by the caller, counted
    assert proxy["failed"] == 0 and proxy["resent"] <= 4, report
