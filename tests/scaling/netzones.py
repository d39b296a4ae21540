"""Two "zones" as network namespaces joined to this host by veth pairs, with ``tc netem`` delay.

Each zone is ``ip netns`` + a veth pair on a link-local /30 (169.254.14.x: never routed, only
this host's own test hosts live there). Where the kernel has ``netem``,
``tc qdisc ... netem delay`` on the host side of a far zone's veth makes its link slow; this
sandbox's kernel has no netem
(``netem_available()``), so the zone tests put the delay in a proxy that runs *inside* the far
zone in front of its replica instead. Needs root and a kernel that allows namespaces;
``available()`` says whether this sandbox does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

IP = shutil.which("ip")
TC = shutil.which("tc")


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=10)


def available() -> str | None:
    """None when namespaces work here; otherwise why not."""
    if IP is None or TC is None:
        return "iproute2 (ip, tc) not installed (`make services` installs it)"
    probe = f"rl14p{os.getpid() % 100000}"
    done = subprocess.run([IP, "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"network namespaces not permitted in this sandbox: {done.stderr.strip()}"
    subprocess.run([IP, "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Zone:
    name: str
    host_if: str
    address: str  # the zone's address (servers bind here)
    host_address: str

    def exec_prefix(self) -> list[str]:
        return [IP or "ip", "netns", "exec", self.name]


def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (this sandbox's does not: 'qdisc kind unknown')."""
    tag = f"rl14n{os.getpid() % 10000}"
    made = subprocess.run(["ip", "link", "add", tag, "type", "veth", "peer", "name", tag + "p"],
                          capture_output=True)
    if made.returncode != 0:
        return False
    try:
        done = subprocess.run(["tc", "qdisc", "add", "dev", tag, "root", "netem", "delay",
                               "1ms"], capture_output=True)
        return done.returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", tag], capture_output=True)


def make_zone(index: int) -> Zone:
    tag = f"{os.getpid() % 10000}{index}"
    name, host_if, zone_if = f"rl14z{tag}", f"rl{tag}h", f"rl{tag}z"
    base = 4 * ((os.getpid() % 30) * 2 + index)  # a /30 per zone (up to .238), varied by run
    host_addr, zone_addr = f"169.254.14.{base + 1}", f"169.254.14.{base + 2}"
    _run("ip", "netns", "add", name)
    try:
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", zone_if)
        _run("ip", "link", "set", zone_if, "netns", name)
        _run("ip", "addr", "add", f"{host_addr}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run("ip", "netns", "exec", name, "ip", "addr", "add", f"{zone_addr}/30", "dev", zone_if)
        _run("ip", "netns", "exec", name, "ip", "link", "set", zone_if, "up")
        _run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError:
        remove_zone(Zone(name, host_if, zone_addr, host_addr))
        raise
    return Zone(name, host_if, zone_addr, host_addr)


def remove_zone(zone: Zone) -> None:
    subprocess.run(["ip", "netns", "del", zone.name], capture_output=True)
    subprocess.run(["ip", "link", "del", zone.host_if], capture_output=True)
