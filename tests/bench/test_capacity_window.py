"""The capacity benchmark counts a server's CPU over the client's measured seconds only: the
CPU trace read between two instants, and a process that burns CPU only outside the window
charged nothing inside it. Its variants start servers with their own settings."""

from __future__ import annotations

import argparse
import os
import time

import pytest

from benchmarks.observability.capacity import SAMPLE_S, CpuTrace, server_env, variant


def test_cpu_between_two_instants_is_read_from_the_samples() -> None:
    trace = CpuTrace.__new__(CpuTrace)  # samples given, no thread
    trace.samples = [(100.0, 1.0), (101.0, 1.5), (102.0, 3.5)]
    assert trace.at(100.5) == pytest.approx(1.25)
    assert trace.at(101.5) - trace.at(100.0) == pytest.approx(1.5)
    assert trace.at(99.0) == 1.0 and trace.at(105.0) == 3.5  # clamped to what was read


def test_work_outside_the_window_is_not_counted() -> None:
    trace = CpuTrace(os.getpid())
    # 0.3 s of this process's own CPU before the window (a client's start-up, its warm-up),
    # however busy the machine is (on a loaded core, 0.3 s of wall time can be a fraction)
    burnt = time.process_time() + 0.3
    give_up = time.monotonic() + 30
    while time.process_time() < burnt and time.monotonic() < give_up:
        pass
    start = time.time()
    time.sleep(0.3)  # the window: this process idle
    end = time.time()
    trace.stop()
    assert trace.at(end) - trace.at(start) < 0.1
    # read between two samples, the instant may lose up to one sample interval of the burn
    assert trace.at(start) - trace.at(trace.samples[0][0]) > 0.3 - SAMPLE_S - 0.05


def test_a_variant_sets_and_unsets_settings_of_its_own() -> None:
    otlp = "http://127.0.0.1:9/v1/traces"
    on = server_env(True, otlp)
    assert on["REDLINE_MONITORING__OTLP_ENDPOINT"] == otlp
    assert "REDLINE_MONITORING__ENABLED" not in on
    assert server_env(False)["REDLINE_MONITORING__ENABLED"] == "false"
    quiet = server_env(True, otlp, settings={"REDLINE_MONITORING__OTLP_ENDPOINT": "",
                                             "REDLINE_MONITORING__TICK_S": "5"})
    assert "REDLINE_MONITORING__OTLP_ENDPOINT" not in quiet  # no trace export
    assert quiet["REDLINE_MONITORING__TICK_S"] == "5"


def test_a_variant_is_read_or_refused_with_its_shape() -> None:
    assert variant("notrace:REDLINE_MONITORING__OTLP_ENDPOINT=,A=1") == (
        "notrace", {"REDLINE_MONITORING__OTLP_ENDPOINT": "", "A": "1"})
    for bad in ("notrace", "notrace:", ":A=1", "x:A=1,B"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME:K=V"):
            variant(bad)


def test_a_variant_may_not_take_a_servers_name() -> None:
    """Refused before any server starts: a variant named "on" would have replaced it."""
    import subprocess
    import sys

    got = subprocess.run([sys.executable, "benchmarks/observability/capacity.py", "--variant",
                          "on:REDLINE_MONITORING__TICK_S=5"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": "src:."})
    assert got.returncode == 2 and "that name is taken" in got.stderr
