#!/usr/bin/env bash
# Same-run comparison of online reads: Feast's Redis online store and redline's.
#
#   bash benchmarks/features/compare_feast.sh [OUT_DIR]
#
# The Feast side is the Feast peer (benchmarks/peers/: its own environment, never a redline
# dependency; made on first use, about four minutes): its in-process reads and the raw redis-py
# floor on the keys it wrote, served from a copy of its Redis snapshot on a private redis-server
# pinned to CPU 1, stopped at the end. redline's read_bench starts its own redis-server and
# compares against the same 5 x HMGET floor.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
OUT=${1:-benchmarks/features/results}
mkdir -p "$OUT"
FEAST_PYTHON=$("$PY" benchmarks/peers/envs.py feast | sed -n 's/^feast=//p')
DATA=$(dirname "$(dirname "$(dirname "$FEAST_PYTHON")")")/data
WORK=$(mktemp -d "${TMPDIR:-/tmp}/redline-feast-reads-XXXXXX")
REDIS_PID=""
trap '[ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null; rm -rf "$WORK"' EXIT
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
REPO=$("$PY" -m benchmarks.peers.feast.store "$DATA" "$WORK" "$PORT")
PIN0=""; PIN1=""
command -v taskset >/dev/null && PIN0="taskset -c 0" && PIN1="taskset -c 1"
$PIN1 redis-server --port "$PORT" --bind 127.0.0.1 --dir "$WORK" --save '' --appendonly no \
  >/dev/null &
REDIS_PID=$!
until [ "$(redis-cli -p "$PORT" ping 2>/dev/null)" = PONG ]; do sleep 0.2; done
$PIN0 "$FEAST_PYTHON" benchmarks/peers/feast/bench_inprocess.py "$REPO" 2000 \
  "$OUT/feast_inprocess.json" > "$OUT/feast_inprocess.log"
$PIN0 "$PY" -m benchmarks.features.read_bench --entities 2000 --calls 2000 \
  > "$OUT/redline_read.json"
"$PY" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
feast = {r["case"]: r for r in json.load(open(f"{out}/feast_inprocess.json"))["results"]}
red = json.load(open(f"{out}/redline_read.json"))
def pick(prefix):
    return next(v for k, v in feast.items() if k.startswith(prefix))
rows = [
    ("Feast get_online_features, 40 refs, 1 row", pick("feast get_online_features, 40 refs, 1 row")),
    ("Feast get_online_features, 40 refs, 10 rows", pick("feast get_online_features, 40 refs, 10 rows")),
    ("floor: pipeline 5x HMGET, 1 row", pick("redis-py pipeline 5x HMGET")),
    ("floor: pipeline 50x HMGET, 10 rows", pick("redis-py pipeline 50x HMGET")),
]
for k in ("floor_5hmget_x1", "redline_redis_computed_x1", "redline_redis_cached_x1",
          "redline_memory_computed_x1", "redline_memory_cached_x1", "floor_5hmget_x10",
          "redline_redis_computed_x10", "redline_redis_cached_x10",
          "redline_memory_computed_x10", "redline_memory_cached_x10"):
    rows.append((k, red[k]))
print("| case | p50 µs | p90 µs | p99 µs |\n|---|---|---|---|")
for name, r in rows:
    print(f"| {name} | {r['p50_us']} | {r['p90_us']} | {r['p99_us']} |")
PY
