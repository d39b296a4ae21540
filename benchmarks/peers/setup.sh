#!/usr/bin/env bash
# Make the peers redline's benchmarks compare with, each in its own virtual environment in the
# peers' cache folder (benchmarks/peers/envs.py says where and what): the floors, MLServer,
# Feast (with its prepared repository, model and Redis snapshot), Ray Serve, Triton from the
# nvidia-pytriton wheel, perf_analyzer.
# What a peer needs from Debian (nginx, redis-server, libb64 for perf_analyzer) is installed
# with apt-get when it is missing and this runs as root; otherwise it says what to install.
#
#   bash benchmarks/peers/setup.sh              # every peer
#   bash benchmarks/peers/setup.sh feast mlserver
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
PEERS=("$@")
[ ${#PEERS[@]} -gt 0 ] || mapfile -t PEERS < <("$PY" "$ROOT/benchmarks/peers/envs.py" --names)

wants() { [[ " ${PEERS[*]} " == *" $1 "* ]]; }
debian() {  # debian COMMAND PACKAGE: install PACKAGE unless COMMAND (or the file) is there
  if command -v "$1" >/dev/null 2>&1 || [ -e "$1" ]; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null
  else
    echo "install the Debian package $2 (or its equivalent) for the peers that need it" >&2
  fi
}
wants floors && debian nginx nginx  # the protocol floor: a canned answer (no Python)
wants feast && debian redis-server redis-server
wants perf-analyzer && debian /usr/lib/x86_64-linux-gnu/libb64.so.0d libb64-0d
"$PY" "$ROOT/benchmarks/peers/envs.py" "${PEERS[@]}"
