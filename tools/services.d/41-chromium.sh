#!/usr/bin/env bash
# Headless Chromium + chromedriver load GET /dashboard under load (tests/monitoring/test_dashboard.py).
command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && exit 0
echo "installing chromium and chromium-driver (the dashboard test drives a headless browser)"
. "$(dirname "$0")/../apt.sh"
apt_install chromium chromium-driver
