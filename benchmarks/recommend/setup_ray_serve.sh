#!/usr/bin/env bash
# Build the Ray Serve peer's own virtual environment under the system temporary folder (never the
# project's venv): ray[serve] plus what the peer graph runs (ONNX Runtime, numpy, redis client).
# Usage: bash benchmarks/recommend/setup_ray_serve.sh    (prints the venv's python)
set -eu
ROOT=$(python3 -c 'import tempfile; print(tempfile.gettempdir())')/redline-ray-serve
VENV=${RAY_SERVE_VENV:-$ROOT/venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
"$VENV/bin/pip" install -q 'ray[serve]' onnxruntime numpy pyarrow redis httpx >&2
"$VENV/bin/python" -c 'import ray; import ray.serve' >&2
echo "$VENV/bin/python"
