"""Ray Serve's throughput-optimized ingress (HAProxy) for a peer run, in one place.

Both Ray peers (``recommend/ray_serve_app.py`` and ``models/peer_apps/ray_app.py``) start Ray
in the mode its docs recommend for throughput; HAProxy's defaults are fixed files and ports
(8404, 9101), so each run gets its own folder and free ports. Standard library only: it is
imported by scripts running in the Ray peer's own environment.
"""

from __future__ import annotations

import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def throughput_env(run_dir: Path) -> dict[str, str]:
    """The environment Ray reads at start for its throughput-optimized mode behind HAProxy,
    with HAProxy's files in ``run_dir`` and its ports free."""
    return {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1",
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(run_dir / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(run_dir / "admin.sock"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(run_dir / "metrics.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(run_dir),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(run_dir / "server-state"),
            "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())}
