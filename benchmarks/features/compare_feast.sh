#!/usr/bin/env bash
# Same-run comparison of online reads: Feast's Redis online store (the peer kit) and redline.
#
#   REDLINE_PEER_KIT=<copy of the peer kit> FEAST_PYTHON=<kit venv>/bin/python \
#   FEAST_REPO=<kit repo dir> \
#     bash benchmarks/features/compare_feast.sh [OUT_DIR]
#
# The kit (the peer kit's feast/, shared/peers/; its own virtual environment, never a redline
# dependency)
# must be set up first with its setup.sh and make_repo.py; its Redis keeps serving Feast's keys.
# redline's read_bench starts its own redis-server and compares against the 5xHMGET floor.
set -euo pipefail
: "${FEAST_PYTHON:?set FEAST_PYTHON to the python of the Feast kit's virtual environment}"
: "${FEAST_REPO:?set FEAST_REPO to the Feast repo the kit's make_repo.py wrote}"
: "${REDLINE_PEER_KIT:?set REDLINE_PEER_KIT to a copy of the peer kit (shared/peers/)}"
OUT=${1:-benchmarks/features/results}
KIT="$REDLINE_PEER_KIT/feast"
mkdir -p "$OUT"
PIN0=""; command -v taskset >/dev/null && PIN0="taskset -c 0"
$PIN0 "$FEAST_PYTHON" "$KIT/bench_inprocess.py" "$FEAST_REPO" 2000 "$OUT/feast_inprocess.json" \
  > "$OUT/feast_inprocess.log"
$PIN0 .venv/bin/python -m benchmarks.features.read_bench --entities 2000 --calls 2000 \
  > "$OUT/redline_read.json"
.venv/bin/python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
data = json.load(open(f"{out}/feast_inprocess.json"))
feast = {r["case"]: r for r in (data["results"] if isinstance(data, dict) else data)}
red = json.load(open(f"{out}/redline_read.json"))
def pick(prefix):
    return next(v for k, v in feast.items() if k.startswith(prefix))
rows = [
    ("Feast get_online_features, 40 refs, 1 row", pick("feast get_online_features, 40 refs, 1 row")),
    ("Feast get_online_features, 40 refs, 10 rows", pick("feast get_online_features, 40 refs, 10 rows")),
    ("kit floor: pipeline 5x HMGET, 1 row", pick("redis-py pipeline 5x HMGET (9 fields")),
    ("kit floor: pipeline 50x HMGET, 10 rows", pick("redis-py pipeline 50x HMGET")),
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
