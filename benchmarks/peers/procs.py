"""Every process a peer started, found by a tag in its environment, and stopped.

A peer server may start processes that leave its process group and outlive it: Ray's raylet and
workers, and the HAProxy that Ray Serve's throughput-optimized ingress runs, which keeps its
ports (8404, 9101 by default) after Ray is gone, so the next peer cannot bind them. Each peer is
started with ``REDLINE_PEER_RUN=<tag>`` in its environment; every process it starts inherits the
variable, however it detaches, so ``stop_tagged`` finds them all in ``/proc`` and ends them: a
SIGTERM first, a SIGKILL for whatever is left after ``grace_s``. Only this user's processes
carrying this run's tag are touched.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

TAG_VARIABLE = "REDLINE_PEER_RUN"


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged_env(tag: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the tag added."""
    return {**(os.environ if env is None else env), TAG_VARIABLE: tag}


def tagged(tag: str) -> list[int]:
    """The pids of this user's live processes whose environment carries ``tag``."""
    needle = f"{TAG_VARIABLE}={tag}".encode()
    me, uid, found = os.getpid(), os.getuid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            if needle in (entry / "environ").read_bytes().split(b"\0") and not _zombie(entry):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def stop_tagged(tag: str, grace_s: float = 15.0) -> list[int]:
    """SIGTERM every process carrying ``tag``, SIGKILL those left after ``grace_s``; returns the
    pids that needed the SIGKILL."""
    for pid in tagged(tag):
        _send(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and tagged(tag):
        time.sleep(0.2)
    killed = tagged(tag)
    for pid in killed:
        _send(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and tagged(tag):
        time.sleep(0.1)
    return killed


def pause_tagged(tag: str) -> list[int]:
    """SIGSTOP every process carrying ``tag`` (a server sits out another's measured turn: its
    idle threads, timers and health checks take no CPU from it); ``resume_tagged`` undoes it."""
    pids = tagged(tag)
    for pid in pids:
        _send(pid, signal.SIGSTOP)
    return pids


def resume_tagged(tag: str) -> None:
    for pid in tagged(tag):
        _send(pid, signal.SIGCONT)


class Turns:
    """Whose turn it is, among servers known by their tags. With ``pause``, every other server
    is stopped (SIGSTOP) while one is measured and continued (SIGCONT) for its own turn, after
    ``settle_s`` for the catching up of its timers: on two cores, the idle processes of a server
    not being measured (Ray's GCS, raylet, agents and HAProxy; Triton's and MLServer's threads;
    redline's monitoring tick) otherwise run on the cores the measured one needs, a noise each
    side suffers from the other's side. Measured alone, each gets the machine a deployed server
    would have. A name without a tag (a server this run did not start) is never paused."""

    def __init__(self, tags: dict[str, str | None], pause: bool = True,
                 settle_s: float = 1.0) -> None:
        self.tags = {name: tag for name, tag in tags.items() if pause and tag}
        self.settle_s = settle_s
        self.paused: set[str] = set()

    def take(self, name: str) -> None:
        for other, tag in self.tags.items():
            if other != name and other not in self.paused:
                pause_tagged(tag)
                self.paused.add(other)
        if name in self.paused:
            resume_tagged(self.tags[name])
            self.paused.discard(name)
            time.sleep(self.settle_s)

    def end(self) -> None:
        """Every paused server continued (a stopped process acts on SIGTERM only then)."""
        for name in list(self.paused):
            resume_tagged(self.tags[name])
            self.paused.discard(name)


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _zombie(entry: Path) -> bool:
    """A zombie has exited (only its parent's wait is missing): nothing left to stop."""
    return entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
