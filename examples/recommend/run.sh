#!/usr/bin/env bash
# The recommender end to end in one command: generate, train (offline metrics), add the graph,
# serve it (one process, memory store), replay held-out sessions (online metrics, latency).
# Smaller: ITEMS=5000 USERS=800 bash run.sh
set -euo pipefail
cd "$(dirname "$0")"
ITEMS=${ITEMS:-50000}
USERS=${USERS:-4000}
SESSIONS=${SESSIONS:-300}
PORT=${PORT:-8000}
python -c 'import embeddings; embeddings.require_torch()'  # PyTorch: `make demo` leaves it out
python generate.py --out data --items "$ITEMS" --users "$USERS"
python train.py --data data --out artifacts
rm -rf .redline/models/recommend
redline models add -m recommend artifacts --config redline.yaml
python replay.py --data data --sessions "$SESSIONS" --write-history data/history.jsonl
redline serve --config redline.yaml --http-port "$PORT" --grpc-port 0 \
    --preload data/history.jsonl &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
curl -s --retry 60 --retry-connrefused --retry-delay 1 "127.0.0.1:$PORT/v2/health/ready" >/dev/null
python replay.py --url "http://127.0.0.1:$PORT" --data data --sessions "$SESSIONS"
