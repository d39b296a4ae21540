"""deploy/haproxy/haproxy.cfg in front of three local replicas: SIGKILL and SIGTERM under load."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.scaling.procs import CONFIG as SERVE_CONFIG
from tests.scaling.procs import Serve, SteadyLoad
from tests.scaling.test_workers import grpc_infer

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy")


@pytest.fixture()
def balanced(tmp_path: Path):  # type: ignore[no-untyped-def]
    if HAPROXY is None:
        pytest.skip("haproxy not installed (`make services` installs it)")
    for i in range(3):
        (tmp_path / f"r{i}").mkdir()
    # drain_grace_s: after SIGTERM a replica answers not-ready for 1.2 s before it closes its
    # listeners, time for two failed checks (500 ms apart) to take it out of rotation.
    config = SERVE_CONFIG + "  drain_grace_s: 1.2\n"
    replicas = [Serve(tmp_path / f"r{i}", "--workers", "1", config=config) for i in range(3)]
    http, grpc_port = free_port(), free_port()
    env = {**os.environ, "REDLINE_LB_HTTP": f"127.0.0.1:{http}",
           "REDLINE_LB_GRPC": f"127.0.0.1:{grpc_port}"}
    for n, r in enumerate(replicas, 1):
        env.update({f"REDLINE_R{n}_HOST": "127.0.0.1", f"REDLINE_R{n}_HTTP": str(r.http_port),
                    f"REDLINE_R{n}_GRPC": str(r.grpc_port)})
    log = (tmp_path / "haproxy.log").open("w")
    proxy = subprocess.Popen([HAPROXY, "-db", "-f", str(CONFIG)], env=env, stdout=log,
                             stderr=subprocess.STDOUT)
    try:
        for r in replicas:
            r.wait_ready()
        time.sleep(1.5)  # two good checks (rise 2, every 500 ms) put every replica in rotation
        assert proxy.poll() is None, (tmp_path / "haproxy.log").read_text()[-2000:]
        yield f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc_port}", replicas, tmp_path
    finally:
        proxy.terminate()
        proxy.wait(10)
        log.close()
        for r in replicas:
            r.kill()


def test_sigkill_one_of_three_replicas_under_load(balanced) -> None:  # type: ignore[no-untyped-def]
    url, grpc_target, replicas, tmp_path = balanced
    assert grpc_infer(grpc_target) == [0.0, 2.0, 4.0, 6.0]  # gRPC (h2) through the balancer
    # Failures are counted as everywhere in tests/scaling (procs.py): a client may resend an
    # inference once on a connection HAProxy closed without an answer or on HAProxy's own 502
    # page (2.6, a replica killed under a connection it reused; seen once); HAProxy itself must
    # absorb the rest (its own retries, logged as +1), so client retries stay rare.
    with SteadyLoad(url, threads=4, seconds=15, retries=1) as load:
        time.sleep(1.0)
        before = load.result.ok
        replicas[0].kill()  # SIGKILL: its in-flight requests die with it
        time.sleep(1.5)
        # SIGTERM another: it drains (readiness false, in-flight finish) and exits 0.
        replicas[1].proc.send_signal(signal.SIGTERM)
        assert replicas[1].proc.wait(20) == 0
        time.sleep(1.0)
        result = load.stop()
    log = (tmp_path / "haproxy.log").read_text()
    assert result.failed == 0, (result.errors[:5], log[-3000:])
    assert result.ok > before > 0
    assert result.retries <= 4, result
    assert "/+1 " in log  # HAProxy re-sent requests the dead or draining replica never answered
    assert "r1 is DOWN" in log and "r2 is DOWN" in log, log[-3000:]
    # The drained replica left on its readiness (HTTP 503), not on a refused connection.
    assert re.search(r"redline_http/r2 is DOWN, reason: Layer7 wrong status, code: 503", log), \
        log[-3000:]
    assert grpc_infer(grpc_target)[1] == 2.0
