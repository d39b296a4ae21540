#!/usr/bin/env bash
# kinesalite (Kinesis's API on LevelDB, from the npm registry) is the stream the Kinesis ingest
# tests start on a free port (tests/features/test_ingest_kinesis.py); make sure it is installed.
PREFIX=/opt/redline-tools/kinesalite
[ -f "$PREFIX/node_modules/kinesalite/cli.js" ] && exit 0
if ! command -v npm >/dev/null 2>&1; then
  . "$(dirname "$0")/../apt.sh"
  apt_install nodejs npm
fi
echo "installing kinesalite (npm) into $PREFIX"
mkdir -p "$PREFIX"
npm install --silent --no-audit --no-fund --prefix "$PREFIX" kinesalite@3.3.3 >/dev/null
