"""The shared host-memory region of one engine instance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import Completion


class Region(Protocol):
    @property
    def name(self) -> str:
        """Stable name of the region (the file name for a /dev/shm region)."""
        ...

    @property
    def layout(self) -> Layout:
        """Row width, dtype and number of blocks of the data area."""
        ...

    def data(self) -> memoryview:
        """The writable data area, `layout.data_bytes` long; owned by the region, valid until close."""
        ...

    def post_completions(self, rank: int, tickets: Sequence[int], *, ok: bool = True) -> int:
        """Record that rank `rank` finished (`ok`) or gave up on (not `ok`) the copies under
        `tickets`, in order; non-blocking; safe from any local process.

        Returns how many were recorded: all of them, or the first ones that fit when the reader has
        fallen so far behind that no more can be kept; the caller posts the rest later (a report is
        never dropped or overwritten). Raises ValueError, recording none, for a rank outside
        0..ranks-1 or any ticket outside 1..2**62-1, and RegionError once the region is closed.
        """
        ...

    def drain_completions(self) -> list[Completion]:
        """Completions posted since the last drain, each returned once, in posting order per rank;
        one reader only."""
        ...

    def close(self) -> None:
        """Unmap (and, for the last user, remove) the region; idempotent."""
        ...
