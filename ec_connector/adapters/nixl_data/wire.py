"""The agent-metadata envelope a peer needs to READ from this agent (pure, no NIXL).

NIXL's own metadata (`get_agent_metadata()`) lets a peer reach the agent and carries the
registered memory, but NIXL's Python API does not tell the peer where that memory starts; READ
descriptors need absolute remote addresses. So the envelope adds the data area's address and size:

    magic b"ECNX" | version u16 | reserved u16 | base address u64 | area bytes u64 | NIXL metadata

Little-endian. The size is O(1) in the region size (one registered area). A version other than
ours is rejected before anything else is read (STYLE rule 10).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"ECNX"
VERSION = 1
_HEAD = struct.Struct("<4sHHQQ")


@dataclass(frozen=True, slots=True)
class PeerInfo:
    base_address: int
    area_bytes: int
    nixl_metadata: bytes


def encode(info: PeerInfo) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, 0, info.base_address, info.area_bytes) + info.nixl_metadata


def decode(blob: bytes, *, peer: str) -> PeerInfo:
    """Parse an envelope; ValueError naming the peer and what is wrong with it."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ValueError(f"metadata of peer {peer!r} must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < _HEAD.size or blob[:4] != MAGIC:
        raise ValueError(
            f"metadata of peer {peer!r} is not a NIXL data-plane envelope (expected {MAGIC!r} "
            f"and at least {_HEAD.size} bytes, got {len(blob)} bytes starting {blob[:4]!r})"
        )
    _, version, _, base, size = _HEAD.unpack_from(blob)
    if version != VERSION:
        raise ValueError(
            f"metadata of peer {peer!r} has envelope version {version}; this build reads version "
            f"{VERSION}: run the same ec_connector version on both ends"
        )
    nixl_md = blob[_HEAD.size :]
    if base == 0 or size == 0 or not nixl_md:
        raise ValueError(f"metadata of peer {peer!r} has no registered area or no NIXL metadata")
    return PeerInfo(base_address=base, area_bytes=size, nixl_metadata=nixl_md)
