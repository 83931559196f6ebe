"""The serving bench's ports for replicas that start later: drawn below the kernel's ephemeral
range, so a port named now cannot be handed to another process's bind(0) meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

from ec_connector.benchmarks.ports import ephemeral_low, free_port, free_ports


def test_a_named_port_is_free_and_below_the_ephemeral_range() -> None:
    low = ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: binds


def test_the_ephemeral_range_is_read_from_the_kernel_and_defaults_where_unreadable(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ephemeral_low(str(tmp_path / "range")) == 40000
    assert ephemeral_low(str(tmp_path / "missing")) == 32768
    (tmp_path / "bad").write_text("")
    assert ephemeral_low(str(tmp_path / "bad")) == 32768


def test_ports_drawn_together_are_distinct_and_free() -> None:
    ports = free_ports(12)
    assert len(set(ports)) == 12 and all(1024 <= p < ephemeral_low() for p in ports)
