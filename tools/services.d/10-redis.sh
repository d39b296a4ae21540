#!/usr/bin/env bash
# redis-server is started by the test fixtures themselves (free port, killable); make sure it exists.
command -v redis-server >/dev/null 2>&1 && exit 0
echo "installing redis-server (tests start their own on free ports)"
. "$(dirname "$0")/../apt.sh"
apt_install redis-server
