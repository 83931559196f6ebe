"""Local TCP ports named now for servers that bind them later (stdlib only: the engine tests'
interpreters import it too).

Ports are drawn below the kernel's ephemeral range: a port from that range (what bind to port 0
returns) can be handed to another process's bind(0) or outgoing connection before the server that
was told it starts, tens of seconds later; ports below the range are never handed out that way.
"""

from __future__ import annotations

import random
import socket

PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
DRAWS = 100  # a free port is drawn this many times at most before the kernel's choice is taken


def ephemeral_low(path: str = PORT_RANGE) -> int:
    """The first port of the kernel's ephemeral range (32768, Linux's default, where unreadable)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int) -> list[int]:
    """`n` distinct local TCP ports free now, drawn below the ephemeral range from a random start."""
    low = ephemeral_low()
    draw = random.SystemRandom()
    picked: list[int] = []
    while len(picked) < n:
        picked.append(_one_free(low, draw, picked))
    return picked


def free_port() -> int:
    return free_ports(1)[0]


def _one_free(low: int, draw: random.Random, taken: list[int]) -> int:
    for _ in range(DRAWS):
        port = draw.randrange(max(1024, low - 16384), low)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every draw taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
