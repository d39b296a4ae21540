#!/usr/bin/env bash
# The text classifier end to end in one command: generate tickets, train both models, add the
# cascade and each model alone as graphs, serve them, replay the held-out tickets (accuracy,
# p50/p99). Smaller: TICKETS=2000 REPLAY=200 bash run.sh; CONCURRENCY clients at once (4).
set -euo pipefail
cd "$(dirname "$0")"
TICKETS=${TICKETS:-6000}
REPLAY=${REPLAY:-600}
PORT=${PORT:-8000}
CONCURRENCY=${CONCURRENCY:-4}
python generate.py --out data --tickets "$TICKETS"
python train.py --data data --out artifacts
rm -rf .redline/models
for graph in cascade:textclf logistic:textclf_logistic mlp:textclf_mlp; do
    redline models add -m "${graph#*:}" "artifacts/${graph%%:*}" --sample artifacts/sample.npz \
        --trust-code --repository .redline/models
done
redline serve --repository .redline/models --http-port "$PORT" --no-grpc &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
curl -s --retry 60 --retry-connrefused --retry-delay 1 "127.0.0.1:$PORT/v2/health/ready" >/dev/null
python replay.py --url "http://127.0.0.1:$PORT" --data data --tickets "$REPLAY" \
    --concurrency "$CONCURRENCY"
