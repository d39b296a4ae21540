#!/usr/bin/env bash
# haproxy fronts three local replicas in tests/scaling/test_haproxy.py (the config in deploy/haproxy/);
# iproute2 (ip netns, tc) gives the zone tests their namespaces where the sandbox allows them.
if command -v haproxy >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1; then
  exit 0
fi
echo "installing haproxy and iproute2 (load-balancer and zone tests)"
. "$(dirname "$0")/../apt.sh"
apt_install haproxy iproute2
