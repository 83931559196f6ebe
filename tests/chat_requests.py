"""What the engine tests send to a vLLM OpenAI server: image chat requests, their images, a port.

Stdlib only: the CPU suite's test venv and the GPU machine's interpreter both import it.
"""

from __future__ import annotations

import base64
import random
import socket
import struct
import zlib
from pathlib import Path


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` free ports below the kernel's ephemeral range, from a random start.

    The engines bind them tens of seconds after they are picked; a port the kernel handed out
    (bind to 0) can meanwhile go to another socket, such as a connection of the engines of the other
    pytest worker, while ports below the ephemeral range are never handed out that way."""
    low = _ephemeral_start()
    rng = random.Random()
    picked: list[int] = []
    while len(picked) < n:
        port = rng.randrange(max(1024, low - 12_000), low)
        if port in picked:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        picked.append(port)
    return picked


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def png(seed: int, size: tuple[int, int]) -> str:
    """A noise PNG of `size` as a data URL (stdlib only: the test venv has no PIL)."""
    width, height = size
    rng = random.Random(seed)
    rows = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def chat_body(image: str, *, max_tokens: int = 4) -> dict:
    """A greedy chat completion of one image and a short text, `max_tokens` tokens whatever comes."""
    return {
        "model": "tiny",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image}},
                    {"type": "text", "text": "Describe."},
                ],
            }
        ],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
