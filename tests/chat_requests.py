"""What the engine tests send to a vLLM OpenAI server: image chat requests, their images, a port.

Stdlib only (and the package's stdlib-only port helper): the CPU suite's test venv and the GPU
machine's interpreter both import it.
"""

from __future__ import annotations

import base64
import random
import struct
import zlib

from ec_connector.benchmarks.ports import free_port, free_ports  # noqa: F401  (the engine tests' import)


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
