# A project's models and feature definitions as an image of their own, so a model version ships
# (and rolls back) by tag without rebuilding redline's image. The pods' init container copies
# /bundle into the project volume at /srv/redline (deploy/kubernetes/serve.yaml, ingest.yaml).
# Build it from a project folder (`redline init`: .redline/models and features.py):
#
#   docker build -f deploy/container/bundle.Dockerfile -t redline-bundle:1 path/to/project
FROM busybox:1.37.0
COPY .redline/models /bundle/models
COPY features.py /bundle/features.py
USER 10001:10001
