#!/usr/bin/env bash
# Java 17 or newer runs the local Spark of the Spark training-set tests (redline[spark]: PySpark
# starts a JVM). Debian's headless JRE is enough: no GUI, no compiler.
java_major() {
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1") ? v[2] : v[1]; exit}'
}
if command -v java >/dev/null 2>&1 && [ "$(java_major)" -ge 17 ] 2>/dev/null; then exit 0; fi
echo "installing openjdk-17-jre-headless (Java for the Spark training-set tests)"
. "$(dirname "$0")/../apt.sh"
apt_install openjdk-17-jre-headless
