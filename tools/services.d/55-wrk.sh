#!/usr/bin/env bash
# wrk is the load generator of benchmarks/scaling/workers.py (C, a few µs of CPU per request, so
# on a 2-core machine it leaves the cores to the workers it measures). No test needs it.
command -v wrk >/dev/null 2>&1 && exit 0
echo "installing wrk (the workers benchmark's load generator)"
. "$(dirname "$0")/../apt.sh"
apt_install wrk
