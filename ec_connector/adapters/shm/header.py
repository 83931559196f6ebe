"""The region file's header: what it records, where each part lies, and how a joiner checks it.

File layout. Every integer is a u64 in native byte order (little-endian: the region is only ever
shared between processes of one x86-64/aarch64 host) at an 8-byte-aligned offset.

    offset 0        control page (4096 bytes)
        0     magic b"VLLMECRG"
        8     format version (FORMAT_VERSION)
        16    data offset (= header bytes, page-aligned)
        24    data bytes (= layout.data_bytes)
        32    hidden_dim
        40    num_blocks
        48    block_size_bytes
        56    dtype: 16 bytes of ASCII, NUL-padded
        72    ranks: completion rings, one per TP/PCP rank
        80    participants: local processes that will map the region (workers + scheduler)
        88    ring slots per rank
        96    creator pid
        104   creation time, ns since the epoch
        112   file size in bytes
        120   joined: how many participants have joined (changed only under the join lock)
        128   unlinked_by: pid of the participant that removed the file name (0 while linked)
        2048  participant table: one pid per slot (0 = not joined yet), MAX_PARTICIPANTS slots
    offset 4096     completion rings, rank r at 4096 + r * ring_stride, ring_stride = 128 + 8 * slots
        +0    write count: completions ever posted by rank r (written only by rank r)
        +64   read cursor: completions of rank r ever drained (written only by the reader;
              on its own cache line so writer and reader do not share one)
        +128  ring_slots encoded completions; post number n lives in slot n % ring_slots
    data offset     the data area, layout.data_bytes long:
                    data offset = round_up(4096 + ranks * ring_stride, 4096)

With the default 4096 slots the header costs 40 KiB for 1 rank, 264 KiB for 8 (4096 + 32,896 per
rank, rounded up to a page); the file is `data offset + data bytes` long.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields

from ec_connector.domain.layout import Layout

MAGIC = b"VLLMECRG"
FORMAT_VERSION = 1
PAGE = 4096
MAX_PARTICIPANTS = 256
MAX_RANKS = 256
DEFAULT_RING_SLOTS = 4096

# word indices (byte offset // 8) of fields read through the mapping
CREATOR_PID_WORD = 96 // 8
JOINED_WORD = 120 // 8
UNLINKED_BY_WORD = 128 // 8
PID_TABLE_WORD = 2048 // 8
RING_BASE = PAGE
RING_HEAD = 128  # bytes before the slots of one ring: write count line + read cursor line
READ_CURSOR_OFFSET = 64

_FIXED = struct.Struct("<8s Q Q Q Q Q Q 16s Q Q Q Q Q Q Q Q")  # bytes 0..136
FIXED_BYTES = _FIXED.size


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True, slots=True)
class Geometry:
    """Where each part of a region file lies, from its layout and its process counts."""

    data_bytes: int
    ranks: int
    participants: int
    ring_slots: int = DEFAULT_RING_SLOTS

    def __post_init__(self) -> None:
        if not 1 <= self.ranks <= MAX_RANKS:
            raise ValueError(f"ranks {self.ranks!r} is outside 1..{MAX_RANKS}")
        if not 1 <= self.participants <= MAX_PARTICIPANTS:
            raise ValueError(f"participants {self.participants!r} is outside 1..{MAX_PARTICIPANTS}")
        if not 1 <= self.ring_slots <= 1 << 20:
            raise ValueError(f"ring_slots {self.ring_slots!r} is outside 1..2**20")

    @property
    def ring_stride(self) -> int:
        return RING_HEAD + 8 * self.ring_slots

    def ring_offset(self, rank: int) -> int:
        return RING_BASE + rank * self.ring_stride

    @property
    def data_offset(self) -> int:
        return _round_up(RING_BASE + self.ranks * self.ring_stride, PAGE)

    @property
    def file_size(self) -> int:
        return self.data_offset + self.data_bytes


@dataclass(frozen=True, slots=True)
class Header:
    """The fields a creator writes once, before the file is published under its name."""

    version: int
    data_offset: int
    data_bytes: int
    hidden_dim: int
    num_blocks: int
    block_size_bytes: int
    dtype: str
    ranks: int
    participants: int
    ring_slots: int
    creator_pid: int
    created_ns: int
    file_size: int

    @classmethod
    def for_region(cls, layout: Layout, geometry: Geometry, *, pid: int, now_ns: int) -> Header:
        return cls(
            version=FORMAT_VERSION,
            data_offset=geometry.data_offset,
            data_bytes=layout.data_bytes,
            hidden_dim=layout.hidden_dim,
            num_blocks=layout.num_blocks,
            block_size_bytes=layout.block_size_bytes,
            dtype=layout.dtype,
            ranks=geometry.ranks,
            participants=geometry.participants,
            ring_slots=geometry.ring_slots,
            creator_pid=pid,
            created_ns=now_ns,
            file_size=geometry.file_size,
        )

    def pack(self) -> bytes:
        """The fixed fields, with `joined` and `unlinked_by` zero."""
        return _FIXED.pack(
            MAGIC,
            self.version,
            self.data_offset,
            self.data_bytes,
            self.hidden_dim,
            self.num_blocks,
            self.block_size_bytes,
            self.dtype.encode("ascii"),
            self.ranks,
            self.participants,
            self.ring_slots,
            self.creator_pid,
            self.created_ns,
            self.file_size,
            0,
            0,
        )

    @classmethod
    def parse(cls, raw: bytes) -> Header | None:
        """The header in `raw` (the file's first bytes), or None if it is not a region header."""
        if len(raw) < FIXED_BYTES:
            return None
        (
            magic,
            version,
            data_offset,
            data_bytes,
            hidden_dim,
            num_blocks,
            block,
            dtype,
            ranks,
            participants,
            slots,
            pid,
            created,
            size,
            _joined,
            _unlinked,
        ) = _FIXED.unpack_from(raw)
        if magic != MAGIC:
            return None
        return cls(
            version=version,
            data_offset=data_offset,
            data_bytes=data_bytes,
            hidden_dim=hidden_dim,
            num_blocks=num_blocks,
            block_size_bytes=block,
            dtype=dtype.rstrip(b"\0").decode("ascii", "replace"),
            ranks=ranks,
            participants=participants,
            ring_slots=slots,
            creator_pid=pid,
            created_ns=created,
            file_size=size,
        )

    def mismatches(self, expected: Header) -> list[str]:
        """'field: file has X, expected Y' for every field that must agree between the two."""
        skip = {"creator_pid", "created_ns"}
        return [
            f"{f.name}: file has {getattr(self, f.name)!r}, expected {getattr(expected, f.name)!r}"
            for f in fields(self)
            if f.name not in skip and getattr(self, f.name) != getattr(expected, f.name)
        ]
