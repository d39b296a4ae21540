#!/usr/bin/env bash
# Build redline's image from the repository's Dockerfile with no Docker daemon, then start it and
# check readiness. Tools: Debian's buildah (chroot isolation, vfs storage: no daemon, no overlay,
# no user namespaces needed) and, only where Docker Hub cannot be reached, debootstrap.
#
#   sudo apt-get install buildah debootstrap
#   deploy/container/build-without-daemon.sh            # build redline:dev, run it, probe it
#
# It runs the image as deploy/kubernetes/serve.yaml does (entrypoint + the manifest's args, env
# and mounts), with a local redis-server (on PATH) standing in for the cluster's.
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

# Run the image as the serving pod runs it (deploy/kubernetes/serve.yaml): the bundle's models
# and features.py copied into the project volume (what the pod's init container does), the
# ConfigMap's redline.yaml at /etc/redline, the image's own ENTRYPOINT with the manifest's args
# and env, as the image's non-root user. Only the addresses change: chroot isolation shares this
# machine's network, so the server listens on 127.0.0.1:$PORT and Redis is a local one.
echo "starting $IMAGE as deploy/kubernetes/serve.yaml runs it"
PROJECT=$(mktemp -d "$WORK/project.XXXX")   # a project as `redline init` lays it out
POD=$(mktemp -d "$WORK/pod.XXXX")
mkdir -p "$POD/etc/redline" "$POD/srv/redline" "$POD/tmp/redline-metrics"
PYTHONPATH=src .venv/bin/python - "$PROJECT" <<'PY'
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from redline.models import ModelRepository

project = Path(sys.argv[1])
k = numpy_helper.from_array(np.array(2.0, np.float32), "k")
graph = helper.make_graph(
    [helper.make_node("Mul", ["x", "k"], ["y"])], "affine",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])], initializer=[k])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
ModelRepository(project / ".redline" / "models").add_onnx("affine", model.SerializeToString())
(project / "features.py").write_text(
    "from redline.features import Entity, EventSource, FeatureView, count\n"
    "user = Entity('user', join_key='user_id')\n"
    "purchases = EventSource('purchases', user, {'amount': float}, timestamp='ts')\n"
    "user_activity = FeatureView('user_activity', purchases, [count('1h')])\n")
PY
# The bundle image's content (its Dockerfile's COPY lines), copied as the init container copies it.
while read -r word src dst; do
  [ "$word" = COPY ] || continue
  mkdir -p "$POD/bundle"; cp -R "$PROJECT/$src" "$POD$dst"
done <deploy/container/bundle.Dockerfile
cp -R "$POD/bundle/." "$POD/srv/redline/"
# The manifest's ConfigMap, args and env; the image's entrypoint.
PYTHONPATH=src .venv/bin/python - "$POD" >"$WORK/pod.env" <<'PY'
import shlex
import sys
from pathlib import Path

import yaml

docs = [d for p in ("configmap.yaml", "serve.yaml")
        for d in yaml.safe_load_all(Path("deploy/kubernetes", p).read_text()) if d]
(config,) = [d for d in docs if d["kind"] == "ConfigMap"]
for key, value in config["data"].items():
    Path(sys.argv[1], "etc/redline", key).write_text(value)
(serve,) = [d for d in docs if d["kind"] == "Deployment"]
(container,) = serve["spec"]["template"]["spec"]["containers"]
print("ARGS=(" + " ".join(shlex.quote(a) for a in container["args"]) + ")")
print("ENVS=(" + " ".join(shlex.quote(f"{e['name']}={e['value']}")
                          for e in container.get("env", [])) + ")")
PY
# shellcheck disable=SC1091
. "$WORK/pod.env"
mapfile -t ENTRY < <("${B[@]}" inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
REDIS_PORT=${REDIS_PORT:-16379}
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize yes --pidfile "$WORK/redis.pid" --logfile "$WORK/redis.log"
ENV_ARGS=()
for e in "${ENVS[@]}"; do ENV_ARGS+=(--env "$e"); done
chmod -R a+rwX "$POD"
ctr=$("${B[@]}" from "$IMAGE")
echo "running: ${ENTRY[*]} ${ARGS[*]}"
setsid "${B[@]}" run --isolation chroot -v "$POD/etc/redline:/etc/redline" \
  -v "$POD/srv/redline:/srv/redline" -v "$POD/tmp/redline-metrics:/tmp/redline-metrics" \
  "${ENV_ARGS[@]}" --env REDLINE_SERVER__HTTP_PORT="$PORT" --env REDLINE_SERVER__GRPC_ENABLED=false \
  --env REDLINE_FEATURES__REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0" \
  "$ctr" -- "${ENTRY[@]}" "${ARGS[@]}" >"$WORK/serve.log" 2>&1 &
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
kill "$(cat "$WORK/redis.pid")" 2>/dev/null || true
[ "$ok" = 1 ] || { echo "not ready; the server said:"; tail -20 "$WORK/serve.log"; exit 1; }
