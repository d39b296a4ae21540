# redline's container image: `docker build -t redline .` (docs/operations.md#container-image).
# Two stages: the first builds wheels (redline's and every dependency's), the second installs
# only those, with the runtime extras (the Redis and Kafka clients), on a slim base, as a
# non-root user. The entrypoint is `redline`; the command (CMD, or a pod's `args`) says which:
# `serve` by default, `ingest kafka ...` for the ingest pods (deploy/kubernetes).

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[redis,kafka]"

FROM python:3.11-slim AS runtime
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    REDLINE_SERVER__HOST=0.0.0.0
RUN groupadd --system --gid 10001 redline \
    && useradd --system --no-log-init --uid 10001 --gid redline --create-home \
       --home-dir /srv/redline redline
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "redline[redis,kafka]==0.1.0"
USER 10001:10001
# The project folder: mount the model repository at /srv/redline/.redline (and a redline.yaml at
# /srv/redline/redline.yaml if you have one), or let an init container fill it (the Kubernetes
# manifests copy a bundle image there); every setting is also a REDLINE_* variable.
WORKDIR /srv/redline
EXPOSE 8000 8001
# Readiness (every model loaded and warm, not draining), on the configured REST port.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:' + os.environ.get('REDLINE_SERVER__HTTP_PORT', '8000') + '/v2/health/ready', timeout=2)"]
# Exec form: redline is PID 1 and gets SIGTERM itself, then drains (server.drain_timeout_s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["redline"]
CMD ["serve"]
