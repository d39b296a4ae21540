"""Run a Deployment's pod here as the kubelet would, with its paths laid out under one folder.

There is no cluster in the suite, so a pod is run from its parts: the image's ENTRYPOINT, CMD,
ENV and WORKDIR (read from the Dockerfile), the container's ``command``/``args`` and ``env``
(read from the manifest), its volumes (a ConfigMap's keys written as files, an emptyDir made
empty), and its init containers run first. Every absolute path the pod names (mount paths,
the workdir, the bundle image's ``/bundle``) is moved under ``root``, and cluster host names
(``redline-redis:6379``) point at local servers; nothing else is changed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.logwatch import log_to

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
BUNDLE_DOCKERFILE = ROOT / "deploy" / "container" / "bundle.Dockerfile"


@dataclass
class Image:
    """What a container runtime takes from an image: its final stage's exec settings."""

    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    copies: list[tuple[str, str]] = field(default_factory=list)  # COPY source, destination


def read_image(dockerfile: Path) -> Image:
    """The last stage's ENTRYPOINT, CMD, ENV, WORKDIR and COPY lines (exec form only)."""
    image = Image()
    text = dockerfile.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            image = Image()
        elif word == "ENTRYPOINT":
            image.entrypoint, image.cmd = json.loads(rest), []  # a new ENTRYPOINT resets CMD
        elif word == "CMD":
            image.cmd = json.loads(rest)
        elif word == "ENV":
            image.env.update(dict(item.split("=", 1) for item in shlex.split(rest)))
        elif word == "WORKDIR":
            image.workdir = rest
        elif word == "COPY" and not rest.startswith("--"):
            *sources, destination = rest.split()
            image.copies += [(source, destination) for source in sources]
    return image


def argv(image: Image, container: dict[str, Any]) -> list[str]:
    """Kubernetes' rule: ``command`` replaces ENTRYPOINT (and drops CMD); ``args`` replaces CMD."""
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    return [*image.entrypoint, *container.get("args", image.cmd)]


def documents() -> list[dict[str, Any]]:
    return [d for p in sorted(MANIFESTS.glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d]


def deployment(name: str) -> dict[str, Any]:
    (found,) = [d for d in documents() if d["kind"] == "Deployment"
                and d["metadata"]["name"] == name]
    return found


def config_map(name: str) -> dict[str, str]:
    (found,) = [d for d in documents() if d["kind"] == "ConfigMap"
                and d["metadata"]["name"] == name]
    data: dict[str, str] = found["data"]
    return data


class PodLayout:
    """A pod's file system under ``root``; ``hosts`` maps cluster addresses to local ones."""

    def __init__(self, root: Path, pod: dict[str, Any], hosts: dict[str, str]) -> None:
        self.root = root
        self.pod = pod
        self.hosts = hosts
        mounts = {m["mountPath"]: m["name"]
                  for c in [*pod.get("initContainers", []), *pod["containers"]]
                  for m in c.get("volumeMounts", [])}
        by_name = {v["name"]: v for v in pod.get("volumes", [])}
        named: dict[str, str] = {}
        for path, name in mounts.items():
            # One folder per volume: each is mounted at the same path in every container here.
            assert named.setdefault(name, path) == path, f"volume {name} at two paths"
        self.prefixes = sorted({*mounts, read_image(DOCKERFILE).workdir, "/bundle"},
                               key=len, reverse=True)
        for path, name in mounts.items():
            volume = by_name[name]
            target = self.path(path)
            target.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                for key, value in config_map(volume["configMap"]["name"]).items():
                    (target / key).write_text(self.remap(value))
            else:
                assert "emptyDir" in volume, f"volume {name}: only configMap and emptyDir here"

    def path(self, pod_path: str) -> Path:
        return self.root / pod_path.lstrip("/")

    def remap(self, text: str) -> str:
        """Pod paths and cluster addresses in ``text`` made local (longest prefix first)."""
        for prefix in self.prefixes:
            text = text.replace(prefix, str(self.path(prefix)))
        for cluster, local in self.hosts.items():
            text = text.replace(cluster, local)
        return text

    def fill_bundle(self, project: Path) -> None:
        """What the bundle image holds: its Dockerfile's COPY lines, from a project folder."""
        for source, destination in read_image(BUNDLE_DOCKERFILE).copies:
            target = self.path(destination)
            target.parent.mkdir(parents=True, exist_ok=True)
            if (project / source).is_dir():
                shutil.copytree(project / source, target)
            else:
                shutil.copy(project / source, target)

    def run_init_containers(self) -> None:
        for container in self.pod.get("initContainers", []):
            done = subprocess.run([self.remap(a) for a in argv(Image(), container)],
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (container["name"], done.stderr)

    def start(self, container_name: str, env: dict[str, str], log: Path
              ) -> subprocess.Popen[bytes]:
        """The container's process: the image's entrypoint with the manifest's args and env.

        ``redline`` is this environment's console script (the image's is the same package);
        ``env`` adds what a pod's own network namespace would make unnecessary (free ports)."""
        (container,) = [c for c in self.pod["containers"] if c["name"] == container_name]
        image = read_image(DOCKERFILE)
        command = [self.remap(a) for a in argv(image, container)]
        if command[0] == "redline":
            command[0] = str(Path(sys.executable).parent / "redline")
        variables = {**image.env, **{e["name"]: e["value"] for e in container.get("env", [])}}

        full_env = {**os.environ, **{k: self.remap(v) for k, v in variables.items()}, **env}
        workdir = self.path(image.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        with log_to(log, f"pod container {container_name}") as out:
            return subprocess.Popen(command, cwd=workdir, env=full_env, stdout=out,
                                    stderr=subprocess.STDOUT)
