"""A copier over host bytes: payloads are `HostPayload` values instead of device tensors.

Copies write at once; they are reported by `poll` only when released, which is immediately unless
the test holds them (`hold=True`), so service tests can keep copies in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ec_connector.domain.blocks import total_blocks
from ec_connector.domain.errors import LayoutMismatch
from ec_connector.domain.transfers import PlannedCopy, SaveJob
from ec_connector.ports.region import Region


@dataclass(frozen=True, slots=True)
class HostPayload:
    """`rows` rows of `width` elements of `dtype`, as raw bytes."""

    dtype: str
    rows: int
    width: int
    data: bytes


class MemoryCopier:
    def __init__(self, region: Region, *, hold: bool = False) -> None:
        self._region = region
        self._layout = region.layout
        self.hold = hold
        self._in_flight: list[int] = []
        self._released: list[int] = []
        self.saved: list[int] = []
        self.loaded: list[int] = []

    def check(self, payload: object, rows: int) -> None:
        lay = self._layout
        if not isinstance(payload, HostPayload):
            raise LayoutMismatch(f"payload {type(payload).__name__} is not a HostPayload")
        if payload.dtype != lay.dtype or payload.width != lay.hidden_dim:
            raise LayoutMismatch(
                f"payload is {payload.dtype}[{payload.width}] but the region holds "
                f"{lay.dtype}[{lay.hidden_dim}]"
            )
        if payload.rows != rows or len(payload.data) != rows * lay.block_size_bytes:
            raise LayoutMismatch(f"payload has {payload.rows} rows but its entry holds {rows}")

    def save(self, jobs: Sequence[SaveJob]) -> None:
        for job in jobs:
            self.check(job.payload, job.copy.rows)
            _check_extents(job.copy, self._layout.num_blocks)
        data = self._region.data()
        b = self._layout.block_size_bytes
        for job in jobs:
            assert isinstance(job.payload, HostPayload)
            src = job.payload.data
            pos = 0
            for ext in job.copy.extents:
                n = ext.length * b
                data[ext.start * b : ext.start * b + n] = src[pos : pos + n]
                pos += n
            self._start(job.copy.ticket)
            self.saved.append(job.copy.ticket)

    def load(self, copies: Sequence[PlannedCopy]) -> list[object]:
        for copy in copies:
            _check_extents(copy, self._layout.num_blocks)
        data = self._region.data()
        b = self._layout.block_size_bytes
        out: list[object] = []
        for copy in copies:
            raw = b"".join(bytes(data[e.start * b : e.end * b]) for e in copy.extents)
            out.append(HostPayload(self._layout.dtype, copy.rows, self._layout.hidden_dim, raw))
            self._start(copy.ticket)
            self.loaded.append(copy.ticket)
        return out

    def poll(self) -> list[int]:
        out, self._released = self._released, []
        return out

    def in_flight(self) -> int:
        return len(self._in_flight) + len(self._released)

    def release_held(self) -> None:
        """Let every held copy finish (its ticket is returned by the next poll)."""
        self._released.extend(self._in_flight)
        self._in_flight = []

    def close(self) -> None:
        self.release_held()

    def _start(self, ticket: int) -> None:
        (self._in_flight if self.hold else self._released).append(ticket)


def _check_extents(copy: PlannedCopy, num_blocks: int) -> None:
    if any(e.end > num_blocks for e in copy.extents):
        raise LayoutMismatch(f"entry {copy.key!r} has extents beyond the region's {num_blocks} blocks")
    if total_blocks(copy.extents) != copy.rows:
        raise LayoutMismatch(
            f"entry {copy.key!r} has {copy.rows} rows but its extents cover "
            f"{total_blocks(copy.extents)} blocks"
        )
