#!/usr/bin/env bash
# Build redline's image from the repository's Dockerfile with no Docker daemon, then start it and
# check readiness. Tools: Debian's buildah (chroot isolation, vfs storage: no daemon, no overlay,
# no user namespaces needed) and, only where Docker Hub cannot be reached, debootstrap.
#
#   sudo apt-get install buildah debootstrap
#   deploy/container/build-without-daemon.sh            # build redline:dev, run it, probe it
#
# The Dockerfile starts FROM python:3.11-slim. Where that image cannot be pulled (no route to
# Docker Hub), a stand-in is made first and stored under the same name: Debian bookworm
# (debootstrap, from Debian's own mirror) with its python3 (3.11) and pip, `python`/`pip` on the
# PATH as in the official image, and this machine's CA bundle and pip index settings so pip inside
# the build can reach the package index this machine uses. Everything after FROM is the
# repository's Dockerfile, unchanged.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${IMAGE:-redline:dev}
PORT=${PORT:-18000}
WORK=${WORK:-$(mktemp -d)}
B=(buildah --storage-driver vfs)

if ! "${B[@]}" inspect --type image docker.io/library/python:3.11-slim >/dev/null 2>&1 &&
   ! "${B[@]}" pull -q docker.io/library/python:3.11-slim >/dev/null 2>&1; then
  echo "python:3.11-slim cannot be pulled here: making a stand-in from Debian bookworm"
  ROOTFS="$WORK/rootfs"
  debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    bookworm "$ROOTFS" http://deb.debian.org/debian >"$WORK/debootstrap.log"
  ln -sf python3 "$ROOTFS/usr/bin/python"
  ln -sf pip3 "$ROOTFS/usr/bin/pip"
  rm -f "$ROOTFS"/usr/lib/python3*/EXTERNALLY-MANAGED   # the official image's pip installs freely
  cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$ROOTFS/etc/pip.conf"
  rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
  ctr=$("${B[@]}" from scratch)
  mnt=$("${B[@]}" mount "$ctr")
  cp -a "$ROOTFS/." "$mnt/"
  "${B[@]}" umount "$ctr" >/dev/null
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$ctr"
  "${B[@]}" commit -q "$ctr" docker.io/library/python:3.11-slim >/dev/null
  "${B[@]}" rm "$ctr" >/dev/null
  rm -rf "$ROOTFS"
fi

echo "building $IMAGE from the Dockerfile"
time "${B[@]}" bud --isolation chroot --pull=false --layers=false -t "$IMAGE" -f Dockerfile .

# Run the image's own entrypoint (`redline serve`) with its own user, workdir and environment,
# a model repository mounted where the Dockerfile says, and probe readiness from outside.
echo "starting $IMAGE"
PROJECT=$(mktemp -d "$WORK/project.XXXX")
REPO="$PROJECT/.redline"
mkdir -p "$REPO"
PYTHONPATH=src .venv/bin/python - "$REPO/models" <<'PY'
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from redline.models import ModelRepository

k = numpy_helper.from_array(np.array(2.0, np.float32), "k")
graph = helper.make_graph(
    [helper.make_node("Mul", ["x", "k"], ["y"])], "affine",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])], initializer=[k])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
ModelRepository(sys.argv[1]).add_onnx("affine", model.SerializeToString())
PY
chmod -R a+rwX "$PROJECT"
ctr=$("${B[@]}" from "$IMAGE")
# chroot isolation shares this machine's network: the server listens on 127.0.0.1:$PORT here.
setsid "${B[@]}" run --isolation chroot -v "$REPO:/srv/redline/.redline" \
  --env REDLINE_SERVER__HTTP_PORT=$PORT --env REDLINE_SERVER__GRPC_ENABLED=false \
  --env REDLINE_SCALING__WORKERS=1 "$ctr" -- redline serve >"$WORK/serve.log" 2>&1 &
runner=$!
ok=0
for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null 2>&1; then ok=1; break; fi
  sleep 0.5
done
if [ "$ok" = 1 ]; then
  echo "ready: $(curl -fsS "http://127.0.0.1:$PORT/v2/health/ready")"
  curl -fsS -H 'content-type: application/json' \
    -d '{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}' \
    "http://127.0.0.1:$PORT/v2/models/affine/infer"
  echo
fi
# SIGTERM to the server itself (what a container runtime sends to PID 1): it drains and exits 0.
descendants() { local c; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
  echo "$c"; descendants "$c"; done; }
for pid in $(descendants "$runner"); do
  # the image's python running its `redline` script (not buildah, whose arguments name it too)
  if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "^python[0-9.]* [^ ]*bin/redline serve\|^/[^ ]*python[0-9.]* [^ ]*bin/redline serve"; then
    kill -TERM "$pid"
  fi
done
for _ in $(seq 1 60); do kill -0 "$runner" 2>/dev/null || break; sleep 0.5; done
kill -TERM -- "-$runner" 2>/dev/null || true   # only if it did not stop by itself
wait "$runner" 2>/dev/null || true
tail -1 "$WORK/serve.log"
"${B[@]}" rm "$ctr" >/dev/null
[ "$ok" = 1 ] || { echo "not ready; the server said:"; tail -20 "$WORK/serve.log"; exit 1; }
