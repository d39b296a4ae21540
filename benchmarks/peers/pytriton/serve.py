"""Triton Inference Server from the nvidia-pytriton wheel, on a model repository of its own.

    python serve.py REPOSITORY --http-port 8700 --grpc-port 8701 --run-dir DIR

Runs with the ``pytriton`` peer's interpreter (``bash benchmarks/peers/setup.sh pytriton``).
The wheel carries ``tritonserver`` 2.51 with the Python backend only, and one Python backend stub
per Python version. This does what PyTriton itself does before it starts the server, without
PyTriton's own proxy models: it copies the server's backends into ``--run-dir`` with the stub of
this interpreter's Python version, puts the wheel's libraries and this interpreter's own
``lib/`` on ``LD_LIBRARY_PATH`` (else the stub loads the system's libpython, which has no numpy)
and this environment's ``bin/`` first on ``PATH`` (the embedded interpreter finds its
environment, and so numpy and onnxruntime, from the ``python`` there), then replaces itself with
``tritonserver``: HTTP and gRPC on 127.0.0.1, metrics off, model control ``none`` (every model of
the repository loaded at start), logging at its least.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("repository", type=Path)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--run-dir", type=Path, required=True,
                    help="where the server's backends (with this Python's stub) are copied")
    ap.add_argument("--http-threads", type=int, default=0,
                    help="--http-thread-count (0: Triton's default)")
    args = ap.parse_args()
    import pytriton

    package = Path(pytriton.__file__).resolve().parent
    dist = package / "tritonserver"
    libs = package.parent / "nvidia_pytriton.libs"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    server = args.run_dir / "tritonserver"
    if not server.exists():
        shutil.copytree(dist, server, ignore=shutil.ignore_patterns(
            "python_backend_stubs", "triton_python_backend_stub"))
        shutil.copy(dist / "python_backend_stubs" / version / "triton_python_backend_stub",
                    server / "backends" / "python" / "triton_python_backend_stub")
    own_lib = sysconfig.get_config_var("LIBDIR") or str(Path(sys.base_prefix) / "lib")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(libs), own_lib, env.get("LD_LIBRARY_PATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    cmd = [str(server / "bin" / "tritonserver"), "--model-repository", str(args.repository),
           "--backend-directory", str(server / "backends"),
           "--cache-directory", str(server / "caches"),
           "--http-address", "127.0.0.1", "--http-port", str(args.http_port),
           "--grpc-address", "127.0.0.1", "--grpc-port", str(args.grpc_port),
           "--allow-metrics", "false", "--allow-gpu-metrics", "false",
           "--model-control-mode", "none", "--log-verbose", "0", "--log-info", "false",
           "--strict-readiness", "true"]
    if args.http_threads:
        cmd += ["--http-thread-count", str(args.http_threads)]
    os.execve(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
