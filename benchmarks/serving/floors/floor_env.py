"""The floors' own virtual environment, under the system's temporary folder, from PyPI.

The floors (``bare_asgi.py``, ``fastapi_onnx.py``, ``bare_grpc.py``) never run in redline's
environment: what they import is theirs. The environment is built once and reused while its
package list is unchanged (``python floor_env.py`` prints its interpreter).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = ["fastapi", "uvicorn", "httptools", "uvloop", "onnxruntime", "orjson", "numpy",
            "grpcio", "tritonclient[grpc]"]


def floor_python(root: Path | None = None) -> Path:
    """The floors' interpreter, creating the environment on first use."""
    tag = hashlib.sha256(" ".join(PACKAGES).encode()).hexdigest()[:10]
    venv = (root or Path(tempfile.gettempdir())) / f"redline-bench-floors-{tag}"
    python = venv / "bin" / "python"
    done = venv / ".installed"
    if not done.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *PACKAGES], check=True)
        done.touch()
    return python


if __name__ == "__main__":
    print(floor_python())
