"""kinesalite (Kinesis's API on LevelDB, installed by tools/services.d) started on a free port,
with the faults ``kinesalite.js`` can inject: throttled reads and a clock that jumps ahead."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(os.environ.get("REDLINE_KINESALITE",
                              "/opt/redline-tools/kinesalite/node_modules/kinesalite"))
WRAPPER = Path(__file__).with_name("kinesalite.js")
REGION = "us-east-1"


def available() -> str | None:
    """Why kinesalite cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed (make services installs it)"
    if not (PACKAGE / "cli.js").exists():
        return f"kinesalite is not installed at {PACKAGE} (make services installs it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Kinesalite:
    """One kinesalite child on a free port (in-memory); ``kill()`` ends it."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or _free_port()
        self.control = workdir / "control.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self._faults: dict[str, int] = {}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Kinesalite:
        self.control.write_text("{}")
        log = (self.workdir / "kinesalite.log").open("wb")
        env = dict(os.environ, KINESALITE_CONTROL=str(self.control))
        self.proc = subprocess.Popen(
            ["node", str(WRAPPER), str(PACKAGE), "--port", str(self.port),
             "--createStreamMs", "0", "--updateStreamMs", "200", "--shardLimit", "100"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kinesalite exited: "
                                   f"{(self.workdir / 'kinesalite.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("kinesalite did not start listening")

    def client(self) -> Any:
        import boto3

        return boto3.client("kinesis", region_name=REGION, endpoint_url=self.endpoint,
                            aws_access_key_id="test", aws_secret_access_key="test")

    def create_stream(self, name: str, shards: int) -> None:
        client = self.client()
        client.create_stream(StreamName=name, ShardCount=shards)
        self.wait_active(name)

    def wait_active(self, name: str, timeout: float = 15.0) -> None:
        client = self.client()
        deadline = time.monotonic() + timeout
        while client.describe_stream_summary(StreamName=name)[
                "StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
            assert time.monotonic() < deadline, f"stream {name} not ACTIVE in {timeout} s"
            time.sleep(0.05)

    def throttle(self, seconds: float) -> None:
        """Every GetRecords answers ProvisionedThroughputExceededException for ``seconds``."""
        self._fault("throttle_until_ms", int((time.time() + seconds) * 1000))

    def behind(self, ms: int) -> None:
        """GetRecords of an open shard says it is ``ms`` behind the tip of the stream."""
        self._fault("behind_ms", ms)

    def jump_clock(self, ms: int) -> None:
        """kinesalite's clock jumps ``ms`` ahead: every iterator made before it expires."""
        self._fault("clock_offset_ms", self._faults.get("clock_offset_ms", 0) + ms)

    def _fault(self, key: str, value: int) -> None:
        self._faults[key] = value
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._faults))
        tmp.replace(self.control)
        time.sleep(0.1)  # read within 50 ms

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def kinesalite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kinesalite]:
    """One kinesalite for a module's tests (each test makes its own streams)."""
    why = available()
    if why is not None:
        pytest.skip(why)
    server = Kinesalite(tmp_path_factory.mktemp("kinesalite")).start()
    try:
        yield server
    finally:
        server.kill()
