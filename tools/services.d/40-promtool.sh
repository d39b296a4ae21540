#!/usr/bin/env bash
# promtool checks and unit-tests the alert rules in deploy/prometheus (tests/monitoring/test_rules.py).
command -v promtool >/dev/null 2>&1 && exit 0
echo "installing prometheus (for promtool: the alert-rule tests)"
. "$(dirname "$0")/../apt.sh"
apt_install prometheus
