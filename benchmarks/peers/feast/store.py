"""A run's own copy of the Feast peer's online store: its repository and Redis snapshot.

The peer's prepare step (``prepare.py``) leaves in its data folder a Feast repository whose
``feature_store.yaml`` names a Redis port, and ``dump.rdb``, that Redis's snapshot after
materialization. A run copies both into its own folder with the port it chose, then starts a
``redis-server`` there, which loads the snapshot: runs never share a Redis or a port, and none
outlives its run. Standard library only (it runs in redline's environment or the peer's).

    python -m benchmarks.peers.feast.store DATA WORK PORT      # prints the copied repository
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

_CONNECTION = re.compile(r'(connection_string:\s*"?127\.0\.0\.1:)\d+')


def prepared(data: Path) -> dict:
    """What the prepare step recorded (cards, views, features); refuses a half-made folder."""
    info = data / "peer.json"
    if not info.exists() or not (data / "dump.rdb").exists():
        raise FileNotFoundError(f"{data} holds no prepared Feast peer: run "
                                "`bash benchmarks/peers/setup.sh feast`")
    return dict(json.loads(info.read_text()))


def runtime_copy(data: Path, work: Path, port: int) -> Path:
    """The repository and snapshot copied into ``work`` for a Redis on ``port``; returns the
    repository. Start ``redis-server --port PORT --dir WORK`` to serve it."""
    prepared(data)
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    shutil.copytree(data / "repo", repo, dirs_exist_ok=True)
    config = repo / "feature_store.yaml"
    text, found = _CONNECTION.subn(rf"\g<1>{port}", config.read_text())
    if not found:
        raise ValueError(f"{config} names no 127.0.0.1 Redis to repoint")
    config.write_text(text)
    shutil.copy(data / "dump.rdb", work / "dump.rdb")
    return repo


if __name__ == "__main__":
    print(runtime_copy(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
