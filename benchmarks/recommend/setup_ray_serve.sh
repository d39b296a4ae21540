#!/usr/bin/env bash
# The Ray Serve peer's own environment (never redline's): benchmarks/peers/setup.sh makes it in
# the peers' cache folder, with Ray Serve's HAProxy. Prints the environment's python.
# Usage: bash benchmarks/recommend/setup_ray_serve.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
bash "$HERE/../peers/setup.sh" ray-serve | sed -n 's/^ray-serve=//p'
