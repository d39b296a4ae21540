"""The suite's listening ports: each xdist worker picks from a block of its own below the
kernel's ephemeral range, so no client connection's local port and no other worker's pick can
take a port between its pick and the server's bind."""

from __future__ import annotations

import socket

from tests.conftest import PORT_BLOCK, _port_block, free_port


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except OSError:
        return 32768  # Linux's default


def test_workers_have_disjoint_blocks_below_the_ephemeral_range() -> None:
    blocks = [_port_block(w) for w in ("", "gw0", "gw1", "gw2", "gw3")]
    ports = [p for block in blocks for p in block]
    assert len(ports) == len(set(ports)) == 5 * PORT_BLOCK
    assert max(ports) < _ephemeral_start()
    assert _port_block("gw4") == _port_block("")  # beyond five blocks, they are shared again


def test_a_port_is_free_and_not_handed_out_twice_in_a_row() -> None:
    taken = [free_port() for _ in range(50)]
    assert len(set(taken)) == 50
    with socket.socket() as s:  # free: a server can bind it
        s.bind(("127.0.0.1", taken[-1]))


def test_a_held_port_is_skipped() -> None:
    with socket.socket() as holder:
        port = free_port()
        holder.bind(("127.0.0.1", port))
        holder.listen()
        # Go round the whole block: the held port is never handed out.
        assert port not in {free_port() for _ in range(PORT_BLOCK)}
